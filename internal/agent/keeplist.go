package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// KeepListFile is the last fleet keep list the agent saw, in its state
// dir: what it keeps while NATS is away, also across restarts.
const KeepListFile = "fleet-keep.json"

// keepStaleAfter is how long the fleet keep list may go unconfirmed by
// NATS and still be known; after it, it is stale and /readyz says so (not
// a readiness failure: GC keeps the last list it saw).
const keepStaleAfter = time.Minute

// keepConfirmEvery is how often a live watch on a connected NATS counts
// as confirming the list; the file's time is saved at most keepSaveEvery.
const (
	keepConfirmEvery = 5 * time.Second
	keepSaveEvery    = time.Minute
	keepRetryMax     = time.Minute
)

// keepDoc is KeepListFile.
type keepDoc struct {
	Lists map[string]natsbus.KeepList `json:"lists"` // by bucket key
	// ConfirmedAt is the last time the agent knew the lists were NATS's.
	ConfirmedAt time.Time `json:"confirmedAt,omitzero"`
	// Source names the NATS (and cluster) the lists were read from
	// (keepSource): a list read from another one (the embedded server
	// before a move to the fleet's, another cluster) is not this one's.
	Source string `json:"source,omitempty"`
}

// keepSource names where cfg's agent reads the fleet keep list: its
// embedded server or the NATS URLs (without credentials) and JetStream
// domain, and the cluster whose key it watches.
func keepSource(cfg Config) string {
	src := "embedded server"
	if cfg.NATSURL != "" {
		var urls []string
		for _, u := range strings.Split(cfg.NATSURL, ",") {
			u = strings.TrimSpace(u)
			if p, err := url.Parse(u); err == nil && p.User != nil {
				p.User = nil
				u = p.String()
			}
			urls = append(urls, u)
		}
		slices.Sort(urls)
		src = "nats " + strings.Join(urls, ",")
		if cfg.NATSJSDomain != "" {
			src += " domain " + cfg.NATSJSDomain
		}
	}
	return src + ", key " + natsbus.KeepClusterKey(cfg.Cluster)
}

// DefaultKeepListWait is --keep-list-wait's default: how long image
// deletes wait at start for a fleet keep list the node never read. Five
// minutes covers a NATS (or the node's network) coming up after the agent,
// and a kubelet's own image GC runs every five minutes: the node's disk
// fills no faster than it would under the kubelet.
const DefaultKeepListWait = 5 * time.Minute

// fleetKeep is the fleet keep list as this agent last saw it: the lists of
// the two keys it watches (its cluster's and every cluster's), and the
// state of that read (gc.Input): unknown until NATS answered once (or a
// saved list was restored), known while a watch confirms it, stale after.
// Its methods are safe for concurrent use; run owns the watch.
type fleetKeep struct {
	file    string
	keys    []string
	source  string // keepSource: where the list is read from
	started time.Time
	// wait is --keep-list-wait: the planner's bound for a list never read.
	wait time.Duration
	now  func() time.Time
	log  zerolog.Logger
	// changed, if set, is called (outside the lock) after the patterns
	// change; settled when the list is read for the first time with the
	// patterns it had, or the wait for it ends (what image GC held for it
	// may go).
	changed, settled func()
	// failures counts failed watches by cause (natsbus.KeepWatchCauses).
	failures *prometheus.CounterVec

	mu       sync.Mutex
	doc      keepDoc
	saved    time.Time // when the file was last written
	watching bool      // a watch delivered the current values and runs
	seen     map[string]bool
	// cause and failErr are the current run of failed watches' cause and
	// last error ("" while none fails); logged holds the causes logged in
	// that run, each logged once.
	cause, failErr string
	failedAt       time.Time
	logged         map[string]bool
	// read closes when the list is first known in this run (or was
	// restored from the state dir at start); tried when the first watch
	// of this run has ended either way (read, no bucket, or failed).
	read, tried         chan struct{}
	readOnce, triedOnce sync.Once
}

// loadFleetKeep returns the list the state dir holds (none when the file
// is missing or unreadable, which is logged), for the agent started now
// with --keep-list-wait wait, reading the list from source (keepSource).
// A list saved from another source (or by a version that did not say
// which) still keeps by its patterns, but was never read from this one:
// the list is unknown until this source gives it.
func loadFleetKeep(stateDir, cluster, source string, wait time.Duration, now func() time.Time, log zerolog.Logger) *fleetKeep {
	k := &fleetKeep{file: filepath.Join(stateDir, KeepListFile), keys: []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cluster)},
		source: source, started: now(), wait: wait, now: now, log: log, doc: keepDoc{Lists: map[string]natsbus.KeepList{}},
		logged: map[string]bool{}, read: make(chan struct{}), tried: make(chan struct{}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_keep_list_watch_failures_total",
			Help: "Failed watches of the fleet keep list in NATS, by cause (server-too-old, no-jetstream, permission, timeout, disconnected, ...).",
		}, []string{"cause"})}
	for _, c := range natsbus.KeepWatchCauses {
		if c != natsbus.KeepCauseBucketNotFound { // no bucket is no list, not a failure
			k.failures.WithLabelValues(c)
		}
	}
	doc, err := ReadKeepFile(stateDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		log.Warn().Err(err).Str("file", k.file).Msg("fleet keep list file unreadable: starting as if none was saved")
	default:
		k.doc = doc
		if doc.Source != source && !doc.ConfirmedAt.IsZero() {
			log.Warn().Str("saved_from", cmp.Or(doc.Source, "unknown")).Str("source", source).Strs("patterns", k.patterns()).
				Msg("fleet keep list saved from another NATS: its patterns keep, but this NATS's list was never read")
			k.doc.ConfirmedAt = time.Time{}
		} else if len(k.patterns()) > 0 {
			log.Info().Strs("patterns", k.patterns()).Time("confirmed_at", doc.ConfirmedAt).Msg("fleet keep list restored from the state dir")
		}
	}
	if !k.doc.ConfirmedAt.IsZero() {
		k.markRead()
	}
	return k
}

// markRead records that the list is known (once per run).
func (k *fleetKeep) markRead() {
	k.readOnce.Do(func() { close(k.read) })
	k.markTried()
}

// markTried records that the first watch has ended (once per run).
func (k *fleetKeep) markTried() { k.triedOnce.Do(func() { close(k.tried) }) }

// firstTryMax bounds how long image GC waits at start for the first
// watch of the fleet keep list to end (firstTry): a list a working NATS
// gives (the embedded server's at once) is then read before the first
// pass, and a failing one is known to fail.
const firstTryMax = 10 * time.Second

// firstTry waits until the first watch has ended (the list read, or not
// given) or firstTryMax has passed, or ctx ends.
func (k *fleetKeep) firstTry(ctx context.Context) {
	t := time.NewTimer(firstTryMax)
	defer t.Stop()
	select {
	case <-k.tried:
	case <-t.C:
	case <-ctx.Done():
	}
}

// everRead reports whether the list was ever read (now, or by the run
// that saved it).
func (k *fleetKeep) everRead() bool {
	select {
	case <-k.read:
		return true
	default:
		return false
	}
}

// ReadKeepFile reads the fleet keep list an agent saved in stateDir.
func ReadKeepFile(stateDir string) (keepDoc, error) {
	doc := keepDoc{Lists: map[string]natsbus.KeepList{}}
	b, err := os.ReadFile(filepath.Join(stateDir, KeepListFile))
	if err != nil {
		return doc, err
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return doc, fmt.Errorf("%s: %w", KeepListFile, err)
	}
	if doc.Lists == nil {
		doc.Lists = map[string]natsbus.KeepList{}
	}
	return doc, nil
}

// Patterns returns the fleet's patterns in force, sorted, without repeats.
func (k *fleetKeep) Patterns() []string {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.patterns()
}

func (k *fleetKeep) patterns() []string {
	var out []string
	for _, key := range k.keys {
		for _, p := range k.doc.Lists[key].Patterns {
			if gc.ValidKeepPattern(p) == nil { // written by another tool: never trusted blindly
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Age is how long ago the list was last confirmed by NATS; since the
// agent started when it never was (and it restored none).
func (k *fleetKeep) Age(now time.Time) (age time.Duration, confirmed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	at := k.doc.ConfirmedAt
	if at.IsZero() {
		return max(now.Sub(k.started), 0), false
	}
	return max(now.Sub(at), 0), true
}

// Input is the state of the list at now (invariant 7): unknown before it
// was ever read (since the agent started waiting for it), known while
// NATS confirmed it within keepStaleAfter, stale after (the last list
// read, restored from the state dir or kept through an outage). Cause
// says why it is not known.
func (k *fleetKeep) Input(now time.Time) gc.Input {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.input(now)
}

func (k *fleetKeep) input(now time.Time) gc.Input {
	cause := "not read from NATS yet"
	if k.cause != "" {
		cause = k.cause + ": " + k.failErr
	}
	at := k.doc.ConfirmedAt
	switch {
	case at.IsZero():
		return gc.Input{State: gc.InputUnknown, Since: k.started, Cause: cause}
	case now.Sub(at) < keepStaleAfter:
		return gc.Input{State: gc.InputKnown, Since: at}
	}
	if k.cause == "" {
		cause = fmt.Sprintf("not confirmed by NATS for %s", now.Sub(at).Round(time.Second))
	}
	return gc.Input{State: gc.InputStale, Since: at, Cause: cause}
}

// KeepList is the list as image GC plans with it: the patterns in force
// and the state of the read they come from.
func (k *fleetKeep) KeepList() gc.KeepList {
	if k == nil {
		return gc.KeepList{}
	}
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	return gc.KeepList{Input: k.input(now), Patterns: k.patterns()}
}

// waitUntil is when image deletes stop waiting for a list never read
// (zero with no wait).
func (k *fleetKeep) waitUntil() time.Time {
	if k.wait <= 0 {
		return time.Time{}
	}
	return k.started.Add(k.wait)
}

// Setting is the fleet keep list as a policy setting (plan, /status).
func (k *fleetKeep) Setting(now time.Time) Setting {
	in := k.Input(now)
	src := ""
	switch in.State {
	case gc.InputUnknown:
		src = "nats bucket " + natsbus.KeepBucket + ": never read; none saved (" + in.Cause + ")"
	case gc.InputKnown:
		src = fmt.Sprintf("nats bucket %s, confirmed %s ago", natsbus.KeepBucket, now.Sub(in.Since).Round(time.Second))
	default:
		src = fmt.Sprintf("nats bucket %s, confirmed %s ago (stale: %s)", natsbus.KeepBucket, now.Sub(in.Since).Round(time.Second), in.Cause)
	}
	return Setting{Name: "fleet-keep", Value: strings.Join(k.Patterns(), ","), Source: src}
}

// detail is /readyz's line while the list is not known ("" when it is):
// never a readiness failure, since GC keeps what the list could protect.
func (k *fleetKeep) detail(now time.Time) string {
	in := k.Input(now)
	switch in.State {
	case gc.InputKnown:
		return ""
	case gc.InputStale:
		return fmt.Sprintf("fleet keep list: last confirmed by NATS %s ago (%s); keeping the last list seen (%d patterns)",
			now.Sub(in.Since).Round(time.Second), in.Cause, len(k.Patterns()))
	}
	until := k.waitUntil()
	switch {
	case until.IsZero():
		return fmt.Sprintf("fleet keep list: never read (%s); image GC does not wait for it (--keep-list-wait 0s)", in.Cause)
	case now.Before(until):
		return fmt.Sprintf("fleet keep list: never read (%s); image deletes by threshold or maximum age wait for it until %s (--keep-list-wait %s)",
			in.Cause, until.UTC().Format(time.RFC3339), k.wait)
	}
	return fmt.Sprintf("fleet keep list: never read (%s); the wait ended at %s: image GC goes on with --keep-image only",
		in.Cause, until.UTC().Format(time.RFC3339))
}

// apply takes one update of the watch.
func (k *fleetKeep) apply(u natsbus.KeepUpdate) {
	k.log.Debug().Str("key", u.Key).Strs("patterns", u.List.Patterns).Bool("synced", u.Synced).Uint64("revision", u.List.Revision).
		Msg("fleet keep list update")
	k.mu.Lock()
	before := k.patterns()
	now := k.now()
	firstRead := false
	switch {
	case u.Synced:
		// Keys the watch did not deliver do not exist (any more).
		for key := range maps.Clone(k.doc.Lists) {
			if !k.seen[key] {
				delete(k.doc.Lists, key)
			}
		}
		firstRead = !k.everRead()
		k.watching, k.doc.ConfirmedAt = true, now
		k.markRead()
	case u.Err != nil:
		k.log.Warn().Err(u.Err).Str("key", u.Key).Msg("fleet keep list value not understood: keeping the last one")
		k.seen[u.Key] = true
	case len(u.List.Patterns) == 0:
		k.seen[u.Key] = true
		delete(k.doc.Lists, u.Key)
	default:
		k.seen[u.Key] = true
		for _, p := range u.List.Patterns {
			if err := gc.ValidKeepPattern(p); err != nil {
				k.log.Warn().Err(err).Str("key", u.Key).Str("pattern", p).Msg("fleet keep list pattern invalid: it protects nothing")
			}
		}
		k.doc.Lists[u.Key] = u.List
		if k.watching {
			k.doc.ConfirmedAt = now
		}
	}
	after := k.patterns()
	var err error
	if !slices.Equal(before, after) || u.Synced {
		err = k.save(now)
	}
	k.mu.Unlock()
	if err != nil {
		k.log.Warn().Err(err).Str("file", k.file).Msg("fleet keep list not saved: a restart without NATS would not keep it")
	}
	if firstRead {
		e := k.log.Info().Strs("patterns", after).Float64("waited_s", now.Sub(k.started).Seconds())
		if until := k.waitUntil(); !until.IsZero() && !now.Before(until) {
			e = k.log.Warn().Strs("patterns", after).Float64("waited_s", now.Sub(k.started).Seconds())
		}
		e.Msg("fleet keep list read from NATS for the first time: image GC keeps by it")
	}
	if !slices.Equal(before, after) {
		k.log.Info().Strs("patterns", after).Strs("was", before).Msg("fleet keep list changed")
	}
	switch {
	case !slices.Equal(before, after) && k.changed != nil:
		k.changed()
	case firstRead && k.settled != nil:
		k.settled()
	}
}

// confirm counts a live watch on a connected NATS as a confirmation.
func (k *fleetKeep) confirm(connected bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.watching || !connected {
		return
	}
	now := k.now()
	k.doc.ConfirmedAt = now
	if now.Sub(k.saved) >= keepSaveEvery {
		_ = k.save(now)
	}
}

// save writes the file; the caller holds mu.
func (k *fleetKeep) save(now time.Time) error {
	k.doc.Source = k.source
	b, err := json.MarshalIndent(k.doc, "", "  ")
	if err != nil {
		return err
	}
	// Synced before and after the rename: after a power loss the file is
	// the old list or the new one, never empty (an agent cut off from NATS
	// at boot protects by it).
	tmp := k.file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, k.file); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(k.file)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	k.saved = now
	return nil
}

// keepMetrics exports the list's age, size and state at scrape time.
type keepMetrics struct{ k *fleetKeep }

var (
	descKeepAge      = prometheus.NewDesc("gcagent_keep_list_age_seconds", "Time since NATS last confirmed the fleet keep list the agent applies (since start when never).", nil, nil)
	descKeepPatterns = prometheus.NewDesc("gcagent_keep_list_patterns", "Patterns of the fleet keep list in force.", nil, nil)
	descKeepState    = prometheus.NewDesc("gcagent_keep_list_state", "State of the fleet keep list: 1 for the state it is in (known, unknown: never read, stale: not confirmed by NATS for a minute).", []string{"state"}, nil)
	descKeepWaiting  = prometheus.NewDesc("gcagent_keep_list_waiting", "1 while image deletes by threshold or maximum age wait for a fleet keep list never read (--keep-list-wait), else 0.", nil, nil)
)

func (m keepMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeepAge
	ch <- descKeepPatterns
	ch <- descKeepState
	ch <- descKeepWaiting
}

func (m keepMetrics) Collect(ch chan<- prometheus.Metric) {
	now := m.k.now()
	age, _ := m.k.Age(now)
	ch <- prometheus.MustNewConstMetric(descKeepAge, prometheus.GaugeValue, age.Seconds())
	ch <- prometheus.MustNewConstMetric(descKeepPatterns, prometheus.GaugeValue, float64(len(m.k.Patterns())))
	in := m.k.Input(now)
	for _, s := range []gc.InputState{gc.InputKnown, gc.InputUnknown, gc.InputStale} {
		v := 0.0
		if in.State == s {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descKeepState, prometheus.GaugeValue, v, s.String())
	}
	waiting := 0.0
	if until := m.k.waitUntil(); in.State == gc.InputUnknown && now.Before(until) {
		waiting = 1
	}
	ch <- prometheus.MustNewConstMetric(descKeepWaiting, prometheus.GaugeValue, waiting)
}
