package agent

import (
	"cmp"
	"context"
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
// NATS and still be known: three of its watch's heartbeats (the watch
// confirms the list at each one, and ends as stalled when two pass with
// nothing received). After it the list is stale and /readyz says so (not a
// readiness failure: GC keeps the last list it saw).
const keepStaleAfter = 3 * natsbus.DefaultKeepHeartbeat

// The file's confirmation time is saved at most every keepSaveEvery; a
// failed watch is tried again after a backoff of up to keepRetryMax.
const (
	keepSaveEvery = time.Minute
	keepRetryMax  = time.Minute
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
	// Cluster is the last complete cluster keep list (keepcluster.go).
	Cluster *clusterSaved `json:"cluster,omitempty"`
}

// keepSourceEmbedded starts the keepSource of an agent on its embedded
// server, whose store is the agent's own.
const keepSourceEmbedded = "embedded server"

// ownSource reports whether source (keepSource) is the agent's embedded
// server.
func ownSource(source string) bool { return strings.HasPrefix(source, keepSourceEmbedded+",") }

// keepSource names where cfg's agent reads the fleet keep list: its
// embedded server or the NATS URLs (without credentials) and JetStream
// domain, and the cluster whose key it watches.
func keepSource(cfg Config) string {
	src := keepSourceEmbedded
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
// the keys it watches (its cluster's and every cluster's; each key is
// decoded and tracked on its own, so a key more is one entry of keys),
// and the state of that read (gc.Input): unknown until NATS answered once
// with every key understood (or a saved list was restored), known while
// a watch confirms it, stale after. On the agent's embedded server the
// store is the agent's own: a store without the bucket is a known empty
// list, and while the server does not run nothing can change the list
// the agent saved. Its methods are safe for concurrent use; run owns the
// watch.
type fleetKeep struct {
	file    string
	keys    []string
	source  string // keepSource: where the list is read from
	own     bool   // source is the agent's embedded server
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
	// heartbeat is the watch's (natsbus.KeepWatchOptions); zero: the default.
	heartbeat time.Duration
	// cl is the cluster keep list (gcagent-cluster's key); mu guards it.
	cl *clusterKeep

	mu       sync.Mutex
	doc      keepDoc
	saved    time.Time // when the file was last written
	watching bool      // a watch delivered the current values and runs
	seen     map[string]bool
	// bad holds the keys whose current value does not decode (the key's
	// last good list, if any, stays in doc.Lists); warned the invalid
	// patterns already logged, by key and pattern.
	bad    map[string]error
	warned map[string]bool
	// ownDown, on the embedded server, reports that the server does not
	// run (nothing can write its store then); nil until the bus is up.
	ownDown func() bool
	// ownNone says the list is known empty because the embedded store
	// held no bucket at start (until a watch reads the server); ownBehind
	// that the store was written after the copy the agent saved, which
	// then is no evidence of it.
	ownNone, ownBehind bool
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
	cl := newClusterKeep(cluster)
	k := &fleetKeep{file: filepath.Join(stateDir, KeepListFile), keys: []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cluster), cl.key()}, cl: cl,
		source: source, own: ownSource(source), started: now(), wait: wait, now: now, log: log, doc: keepDoc{Lists: map[string]natsbus.KeepList{}},
		logged: map[string]bool{}, bad: map[string]error{}, warned: map[string]bool{}, read: make(chan struct{}), tried: make(chan struct{}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_keep_list_watch_failures_total",
			Help: "Failed watches of the fleet keep list in NATS, by cause (server-too-old, no-jetstream, permission, timeout, disconnected, ...).",
		}, []string{"cause"})}
	for _, c := range natsbus.KeepWatchCauses {
		k.failures.WithLabelValues(c) // no-bucket: only a bucket gone after a list was read from it
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
	if k.doc.Cluster != nil {
		k.cl.last = k.doc.Cluster
		k.cl.rebuild(now())
	}
	if k.own {
		k.loadOwn(stateDir)
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
			// Written by another tool: never trusted blindly. An invalid
			// pattern keeps what it could name (prefixes).
			if gc.ValidKeepPattern(p) == nil {
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
	in := k.operatorInput(now)
	if in.State == gc.InputUnknown {
		return in
	}
	switch state, why := k.cl.input(now); {
	case state == gc.InputUnknown:
		return gc.Input{State: gc.InputUnknown, Since: k.started, Cause: why}
	case state == gc.InputStale && in.State == gc.InputStale:
		in.Cause += "; " + why
	case state == gc.InputStale:
		in = gc.Input{State: gc.InputStale, Since: in.Since, Cause: why}
	}
	return in
}

// operatorInput is input for the operator's keys alone. The caller holds
// mu.
func (k *fleetKeep) operatorInput(now time.Time) gc.Input {
	cause := "not read from NATS yet"
	if k.cause != "" {
		cause = k.cause + ": " + k.failErr
	}
	if bad := k.badCause(); bad != "" {
		cause = bad
	}
	if k.own && k.ownBehind && !k.watching && k.ownDown != nil && k.ownDown() {
		// The store holds a value the copy lacks, and its server cannot
		// give it: the copy is no evidence of the list.
		return gc.Input{State: gc.InputUnknown, Since: k.started, Cause: "the embedded server's store was written after the copy the agent saved, and the server does not run"}
	}
	at := k.doc.ConfirmedAt
	switch {
	case at.IsZero():
		return gc.Input{State: gc.InputUnknown, Since: k.started, Cause: cause}
	case len(k.bad) > 0:
		return gc.Input{State: gc.InputStale, Since: at, Cause: cause + "; keeping its last list"}
	case now.Sub(at) < keepStaleAfter, k.ownQuiet():
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
	if k.cl.expire(now) {
		_ = k.save(now) // best effort: a restart ends the grace again from the file
	}
	return gc.KeepList{Input: k.input(now), Patterns: k.patterns(), Prefixes: k.prefixes(), Declared: k.cl.refs}
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
		switch none, quiet := k.ownEvidence(); {
		case none:
			src = "the embedded server's store, which holds no bucket " + natsbus.KeepBucket + ": none"
		case quiet:
			src = fmt.Sprintf("the embedded server's store, as the agent saved it %s ago; the server does not run, so nothing changes it", now.Sub(in.Since).Round(time.Second))
		}
	default:
		src = fmt.Sprintf("nats bucket %s, confirmed %s ago (stale: %s)", natsbus.KeepBucket, now.Sub(in.Since).Round(time.Second), in.Cause)
	}
	return Setting{Name: "fleet-keep", Value: strings.Join(k.Patterns(), ","), Source: src}
}

// detail is /readyz's line while the list is not known ("" when it is):
// never a readiness failure, since GC keeps what the list could protect.
func (k *fleetKeep) detail(now time.Time) string {
	var lines []string
	k.mu.Lock()
	if d := k.cl.detail(now); d != "" {
		lines = append(lines, d)
	}
	k.mu.Unlock()
	for _, bad := range k.Invalid() {
		lines = append(lines, "fleet keep list: "+bad)
	}
	if d := k.stateDetail(now); d != "" {
		lines = append(lines, d)
	}
	return strings.Join(lines, "\n")
}

// stateDetail is detail's line for the list's state ("" when known).
func (k *fleetKeep) stateDetail(now time.Time) string {
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

// apply takes one update of the watch. The list is read (known) once the
// watch has delivered every key's current value and each of them was
// understood: a key whose value does not decode keeps its last good list
// and makes the list stale, or, never read, leaves it unknown.
func (k *fleetKeep) apply(u natsbus.KeepUpdate) {
	if u.Alive {
		k.confirm()
		return
	}
	k.log.Debug().Str("key", u.Key).Strs("patterns", u.List.Patterns).Bool("synced", u.Synced).Uint64("revision", u.List.Revision).
		Msg("fleet keep list update")
	k.mu.Lock()
	before := k.patterns()
	now := k.now()
	firstRead, badNew, clusterChanged := false, false, false
	switch {
	case !u.Synced && k.cl.owns(u.Key):
		k.seen[u.Key] = true
		clusterChanged = k.cl.apply(u, k.watching, now)
		if k.watching {
			firstRead = k.readNow(now)
		}
	case u.Synced:
		k.ownBehind = false // the server gave the store's list
		clusterChanged = k.cl.synced(k.seen, now)
		k.ownNone = false
		// Keys the watch did not deliver do not exist (any more).
		for key := range maps.Clone(k.doc.Lists) {
			if !k.seen[key] {
				delete(k.doc.Lists, key)
			}
		}
		for key := range maps.Clone(k.bad) {
			if !k.seen[key] {
				delete(k.bad, key)
			}
		}
		k.watching = true
		firstRead = k.readNow(now)
		k.markTried()
	case u.Err != nil:
		k.seen[u.Key] = true
		prev := k.bad[u.Key]
		badNew = prev == nil || prev.Error() != u.Err.Error()
		k.bad[u.Key] = u.Err
	default:
		k.seen[u.Key] = true
		delete(k.bad, u.Key)
		if len(u.List.Patterns) == 0 {
			delete(k.doc.Lists, u.Key)
		} else {
			k.doc.Lists[u.Key] = u.List
		}
		if k.watching {
			firstRead = k.readNow(now)
		}
	}
	after := k.patterns()
	invalid := k.newInvalid()
	read := k.everRead()
	var err error
	if !slices.Equal(before, after) || u.Synced || clusterChanged {
		err = k.save(now)
	}
	nrefs := len(k.cl.refs)
	k.mu.Unlock()
	if err != nil {
		k.log.Warn().Err(err).Str("file", k.file).Msg("fleet keep list not saved: a restart without NATS would not keep it")
	}
	if badNew {
		msg := "fleet keep list value not understood: keeping the key's last list"
		if !read {
			msg = "fleet keep list value not understood, never read: the list stays unknown until the key holds a value this agent understands"
		}
		k.log.Warn().Err(u.Err).Str("key", u.Key).Uint64("revision", u.List.Revision).Msg(msg)
	}
	for _, bad := range invalid {
		k.log.Warn().Str("key", bad.key).Str("pattern", bad.pattern).Str("prefix", bad.prefix).Err(bad.err).
			Msg("fleet keep list pattern invalid: it keeps every image whose name starts with its literal text before the first glob character")
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
	if clusterChanged {
		k.log.Debug().Int("images", nrefs).Str("key", u.Key).Msg("cluster keep list changed")
	}
	switch {
	case (!slices.Equal(before, after) || clusterChanged) && k.changed != nil:
		k.changed()
	case firstRead && k.settled != nil:
		k.settled()
	}
}

// readNow records that the watch gives the list now, when every key was
// understood; it reports whether that is the first read of this run with
// no read before (the wait for it ends). The caller holds mu.
func (k *fleetKeep) readNow(now time.Time) (first bool) {
	if len(k.bad) > 0 {
		return false
	}
	first = !k.everRead()
	k.doc.ConfirmedAt = now
	k.markRead()
	return first
}

// confirm counts a watch that delivered within its heartbeat (an Alive
// update) as a confirmation of the list; never while a key's value is
// not understood.
func (k *fleetKeep) confirm() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.watching || len(k.bad) > 0 || k.doc.ConfirmedAt.IsZero() {
		return
	}
	now := k.now()
	k.doc.ConfirmedAt = now
	if now.Sub(k.saved) >= keepSaveEvery {
		_ = k.save(now)
	}
}
