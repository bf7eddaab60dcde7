package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// KeepListFile is the last fleet keep list the agent saw, in its state
// dir: what it keeps while NATS is away, also across restarts.
const KeepListFile = "fleet-keep.json"

// keepStaleAfter is how long the fleet keep list may go unconfirmed by
// NATS before /readyz says so (not a readiness failure: GC keeps the last
// list it saw).
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
}

// fleetKeep is the fleet keep list as this agent last saw it: the lists of
// the two keys it watches (its cluster's and every cluster's). Its methods
// are safe for concurrent use; run owns the watch.
type fleetKeep struct {
	file    string
	keys    []string
	started time.Time
	now     func() time.Time
	log     zerolog.Logger
	// changed, if set, is called (outside the lock) after the patterns change.
	changed func()

	mu       sync.Mutex
	doc      keepDoc
	saved    time.Time // when the file was last written
	watching bool      // a watch delivered the current values and runs
	seen     map[string]bool
}

// loadFleetKeep returns the list the state dir holds (none when the file
// is missing or unreadable, which is logged).
func loadFleetKeep(stateDir, cluster string, now func() time.Time, log zerolog.Logger) *fleetKeep {
	k := &fleetKeep{file: filepath.Join(stateDir, KeepListFile), keys: []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cluster)},
		started: now(), now: now, log: log, doc: keepDoc{Lists: map[string]natsbus.KeepList{}}}
	doc, err := ReadKeepFile(stateDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		log.Warn().Err(err).Str("file", k.file).Msg("fleet keep list file unreadable: starting without one until NATS answers")
	default:
		k.doc = doc
		if len(k.patterns()) > 0 {
			log.Info().Strs("patterns", k.patterns()).Time("confirmed_at", doc.ConfirmedAt).Msg("fleet keep list restored from the state dir")
		}
	}
	return k
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

// Setting is the fleet keep list as a policy setting (plan, /status).
func (k *fleetKeep) Setting(now time.Time) Setting {
	age, ok := k.Age(now)
	src := "nats bucket " + natsbus.KeepBucket + ": never read; none saved"
	if ok {
		src = fmt.Sprintf("nats bucket %s, confirmed %s ago", natsbus.KeepBucket, age.Round(time.Second))
	}
	return Setting{Name: "fleet-keep", Value: strings.Join(k.Patterns(), ","), Source: src}
}

// detail is /readyz's line when the list is stale ("" when fresh).
func (k *fleetKeep) detail(now time.Time) string {
	age, ok := k.Age(now)
	if age < keepStaleAfter {
		return ""
	}
	if !ok {
		return fmt.Sprintf("fleet keep list: not read from NATS in %s (bucket %s); keeping none", age.Round(time.Second), natsbus.KeepBucket)
	}
	return fmt.Sprintf("fleet keep list: last confirmed by NATS %s ago; keeping the last list seen (%d patterns)",
		age.Round(time.Second), len(k.Patterns()))
}

// apply takes one update of the watch.
func (k *fleetKeep) apply(u natsbus.KeepUpdate) {
	k.log.Debug().Str("key", u.Key).Strs("patterns", u.List.Patterns).Bool("synced", u.Synced).Uint64("revision", u.List.Revision).
		Msg("fleet keep list update")
	k.mu.Lock()
	before := k.patterns()
	now := k.now()
	switch {
	case u.Synced:
		// Keys the watch did not deliver do not exist (any more).
		for key := range maps.Clone(k.doc.Lists) {
			if !k.seen[key] {
				delete(k.doc.Lists, key)
			}
		}
		k.watching, k.doc.ConfirmedAt = true, now
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
	if !slices.Equal(before, after) {
		k.log.Info().Strs("patterns", after).Strs("was", before).Msg("fleet keep list changed")
		if k.changed != nil {
			k.changed()
		}
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

// run watches the list on nc until ctx ends. With create (the agent's own
// embedded server) it creates the bucket (R1) when missing; else a missing
// bucket means no fleet list, retried at a jittered backoff up to a minute.
func (k *fleetKeep) run(ctx context.Context, nc *nats.Conn, create bool) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(keepConfirmEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				k.confirm(nc.IsConnected())
			}
		}
	}()
	backoff, failing := time.Second, ""
	for {
		err = nil
		if create {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = natsbus.EnsureKeepBucket(wctx, js, 1, natsbus.EmbeddedKeepMaxBytes)
			cancel()
		}
		k.mu.Lock()
		k.seen = map[string]bool{}
		k.mu.Unlock()
		if err == nil {
			err = natsbus.WatchKeep(ctx, js, k.keys, func(u natsbus.KeepUpdate) {
				if failing != "" {
					k.log.Info().Msg("fleet keep list watched again")
					failing = ""
				}
				backoff = time.Second
				k.apply(u)
			})
		}
		k.mu.Lock()
		k.watching = false
		k.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) && nc.IsConnected() {
			k.apply(natsbus.KeepUpdate{Synced: true}) // NATS says: no list
		}
		if msg := fmt.Sprint(err); msg != failing {
			failing = msg
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				// A fleet that never made a keep list: nothing is wrong.
				k.log.Info().Str("bucket", natsbus.KeepBucket).Float64("retry_s", backoff.Seconds()).Msg("no fleet keep list on this NATS yet; looking again")
			} else {
				k.log.Warn().Err(err).Float64("retry_s", backoff.Seconds()).Msg("fleet keep list not watched; keeping the last list seen")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, keepRetryMax)
	}
}

// keepMetrics exports the list's age and size at scrape time.
type keepMetrics struct{ k *fleetKeep }

var (
	descKeepAge      = prometheus.NewDesc("gcagent_keep_list_age_seconds", "Time since NATS last confirmed the fleet keep list the agent applies (since start when never).", nil, nil)
	descKeepPatterns = prometheus.NewDesc("gcagent_keep_list_patterns", "Patterns of the fleet keep list in force.", nil, nil)
)

func (m keepMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeepAge
	ch <- descKeepPatterns
}

func (m keepMetrics) Collect(ch chan<- prometheus.Metric) {
	age, _ := m.k.Age(m.k.now())
	ch <- prometheus.MustNewConstMetric(descKeepAge, prometheus.GaugeValue, age.Seconds())
	ch <- prometheus.MustNewConstMetric(descKeepPatterns, prometheus.GaugeValue, float64(len(m.k.Patterns())))
}
