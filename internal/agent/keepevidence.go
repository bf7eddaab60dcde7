package agent

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/prometheus/client_golang/prometheus"
)

// The fleet keep list's evidence beyond what a watch delivers: the
// agent's own embedded store, values that do not decode, patterns that
// are not valid.

// loadOwn takes what the agent's own embedded store says before its
// server runs: a store without the keep list bucket (never made, or
// removed) holds no list, so the list is known and empty; a store with
// one is the list the agent saved itself when it has a saved copy from
// this source (loadFleetKeep restored it), else unknown until the server,
// which runs in process whatever its address, gives it.
func (k *fleetKeep) loadOwn(stateDir string) {
	stored, err := natsbus.EmbeddedKeepStored(stateDir)
	switch {
	case err != nil:
		k.log.Warn().Err(err).Msg("cannot tell whether the embedded server's store holds a fleet keep list: it is read from the server")
	case stored:
		// The copy is the store's only if the store holds nothing written
		// after it (a kill, or a failed save on a full disk, between a
		// `ctl keep` write and the agent's save): else the list is read
		// from the server, and unknown while it does not run.
		written, werr := natsbus.EmbeddedKeepWritten(stateDir)
		saved, serr := os.Stat(k.file)
		if werr != nil || serr != nil || written.After(saved.ModTime()) {
			k.ownBehind = true
			if serr == nil {
				k.log.Info().Time("store_written", written).Time("copy_saved", saved.ModTime()).
					Msg("the embedded server's store was written after the fleet keep list the agent saved: the list is read from the server")
			}
		}
	case !stored:
		if n := len(k.patterns()); n > 0 {
			k.log.Info().Int("patterns", n).Str("saved_from", k.doc.Source).
				Msg("the embedded server's store holds no fleet keep list: the list saved before no longer applies")
		}
		k.doc = keepDoc{Lists: map[string]natsbus.KeepList{}, ConfirmedAt: k.started, Source: k.source}
		k.cl = newClusterKeep(k.cl.cluster)
		k.cl.read = true // the store holds no list: nor the cluster's
		k.ownNone = true
		k.log.Info().Msg("fleet keep list known empty: the embedded server's store holds none")
	}
}

// setOwnServer gives the list, on the embedded server, what says that the
// server does not run.
func (k *fleetKeep) setOwnServer(down func() bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ownDown = down
}

// ownQuiet reports that the list lives in the agent's own store and its
// server does not run: nothing can change it, so the list read or saved
// last is the store's. The caller holds mu.
func (k *fleetKeep) ownQuiet() bool { return k.own && !k.ownBehind && k.ownDown != nil && k.ownDown() }

// ownEvidence says what of the agent's own store makes the list known
// now: its store held no bucket at start (none), or its server does not
// run (quiet).
func (k *fleetKeep) ownEvidence() (none, quiet bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ownNone, k.ownQuiet()
}

// badCause says which keys' values are not understood ("" when none).
// The caller holds mu.
func (k *fleetKeep) badCause() string {
	var out []string
	for _, key := range k.keys {
		if err := k.bad[key]; err != nil {
			out = append(out, fmt.Sprintf("value of key %s not understood: %v", key, err))
		}
	}
	return strings.Join(out, "; ")
}

// invalidPattern is a fleet pattern path.Match refuses, and the literal
// text the patterns it keeps by start with.
type invalidPattern struct {
	key, pattern, prefix string
	err                  error
}

// invalids are the invalid patterns in force, in key order. The caller
// holds mu.
func (k *fleetKeep) invalids() []invalidPattern {
	var out []invalidPattern
	for _, key := range k.keys {
		for _, p := range k.doc.Lists[key].Patterns {
			if err := gc.ValidKeepPattern(p); err != nil {
				out = append(out, invalidPattern{key: key, pattern: p, prefix: literalPrefix(p), err: err})
			}
		}
	}
	return out
}

// newInvalid returns the invalid patterns in force not logged yet in
// this run, and marks them logged. The caller holds mu.
func (k *fleetKeep) newInvalid() []invalidPattern {
	var out []invalidPattern
	for _, bad := range k.invalids() {
		if id := bad.key + "\x00" + bad.pattern; !k.warned[id] {
			k.warned[id] = true
			out = append(out, bad)
		}
	}
	return out
}

// Invalid describes each invalid pattern in force and what it keeps, for
// /readyz and check.
func (k *fleetKeep) Invalid() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, bad := range k.invalids() {
		keeps := fmt.Sprintf("every image whose name starts with %q", bad.prefix)
		if bad.prefix == "" {
			keeps = "every image"
		}
		out = append(out, fmt.Sprintf("pattern %q of key %s is invalid (%v): it keeps %s", bad.pattern, bad.key, bad.err, keeps))
	}
	return out
}

// literalPrefix is pattern's text before its first character with a
// meaning to path.Match (* ? [ \).
func literalPrefix(pattern string) string {
	if i := strings.IndexAny(pattern, `*?[\`); i >= 0 {
		return pattern[:i]
	}
	return pattern
}

// prefixes are the literal prefixes the invalid fleet patterns in force
// keep by (gc.KeepList.Prefixes): every image whose name, as stored or in
// its familiar form, starts with one ("nginx:1.[2" keeps
// docker.io/library/nginx:1.25, as nginx:1.* would, and deeper names
// too), every image for one with no literal text. An invalid pattern is a
// typo of one that names something: keeping too much until it is fixed
// is the fail-closed answer, and the list's other patterns still apply;
// making the whole list unknown instead would keep every image for
// --keep-list-wait and then protect nothing it names. The caller holds
// mu.
func (k *fleetKeep) prefixes() []string {
	var out []string
	for _, bad := range k.invalids() {
		out = append(out, bad.prefix)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// keepMetrics exports the list's age, size and state at scrape time.
type keepMetrics struct{ k *fleetKeep }

var (
	descKeepAge      = prometheus.NewDesc("gcagent_keep_list_age_seconds", "Time since NATS last confirmed the fleet keep list the agent applies (since start when never).", nil, nil)
	descKeepPatterns = prometheus.NewDesc("gcagent_keep_list_patterns", "Patterns of the fleet keep list in force.", nil, nil)
	descKeepState    = prometheus.NewDesc("gcagent_keep_list_state", "State of the fleet keep list: 1 for the state it is in (known, unknown: never read, stale: not confirmed by NATS for a minute).", []string{"state"}, nil)
	descKeepWaiting  = prometheus.NewDesc("gcagent_keep_list_waiting", "1 while image deletes by threshold or maximum age wait for a fleet keep list never read (--keep-list-wait), else 0.", nil, nil)
	descKeepInvalid  = prometheus.NewDesc("gcagent_keep_list_invalid_patterns", "Invalid patterns in the fleet keep list: each keeps every image whose name starts with its literal text before the first glob character.", nil, nil)
	descClusterKeep  = prometheus.NewDesc("gcagent_keep_list_cluster_images", "Images the cluster keep list (gcagent-cluster's) keeps now.", nil, nil)
	descClusterState = prometheus.NewDesc("gcagent_keep_list_cluster_state", "State of the cluster keep list: 1 for the state it is in (not-read, saved, absent, gone: its head went and the last complete list keeps for its grace, syncing, incomplete, stale, complete).", []string{"state"}, nil)
)

func (m keepMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeepAge
	ch <- descKeepPatterns
	ch <- descKeepState
	ch <- descKeepWaiting
	ch <- descKeepInvalid
	ch <- descClusterKeep
	ch <- descClusterState
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
	ch <- prometheus.MustNewConstMetric(descKeepInvalid, prometheus.GaugeValue, float64(len(m.k.Invalid())))
	m.k.mu.Lock()
	images, state := len(m.k.cl.refs), m.k.cl.state(now)
	m.k.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descClusterKeep, prometheus.GaugeValue, float64(images))
	for _, s := range clusterStates {
		v := 0.0
		if s == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descClusterState, prometheus.GaugeValue, v, s)
	}
}
