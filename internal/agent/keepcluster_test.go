package agent

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// clusterValues are the keys gcagent-cluster writes for a list of
// images, by layout (declared.Layout), with its head.
func clusterValues(t *testing.T, cluster string, state declared.State, heartbeat time.Time, images ...string) map[string][]byte {
	t.Helper()
	var es []declared.Entry
	for _, im := range images {
		es = append(es, declared.Entry{Image: im, By: []declared.Workload{{Kind: "CronJob", Namespace: "batch", Name: "r"}}})
	}
	shards := declared.Layout(es, 0)
	out := map[string][]byte{}
	for i, s := range shards {
		b, _ := json.Marshal(s)
		out[declared.ShardKey(cluster, len(shards), i)] = b
	}
	b, _ := json.Marshal(declared.Head{State: state, Shards: len(shards), Images: len(images), Heartbeat: heartbeat, HeartbeatEveryS: 1, By: "c-0"})
	out[declared.HeadKey(cluster)] = b
	return out
}

func refsOf(k *fleetKeep) []string { return slices.Sorted(maps.Keys(k.KeepList().Declared)) }

// TestClusterKeepStates (issue 41, fail closed): the cluster list keeps
// what a complete, alive list names, merged with the operator's patterns;
// syncing before it was ever complete is unknown (deletes wait); a list
// that stops being complete, or whose component stops its heartbeat, is
// stale and keeps the last complete list, also across a restart; an
// undecodable value never counts; a head deleted is an empty list.
func TestClusterKeepStates(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clk := func() time.Time { return now }
	k := loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clk, zerolog.Nop())
	changes := 0
	k.changed = func() { changes++ }
	deliver := func(vals map[string][]byte, synced bool) {
		t.Helper()
		keys := slices.Sorted(maps.Keys(vals))
		for _, key := range keys {
			k.apply(natsbus.KeepUpdate{Key: key, Value: vals[key]})
		}
		if synced {
			k.apply(natsbus.KeepUpdate{Synced: true})
		}
	}
	start := func() { k.mu.Lock(); k.seen = map[string]bool{}; k.watching = false; k.mu.Unlock() }

	// Syncing, never complete: unknown, the wait's clock from the start.
	start()
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*"}}})
	deliver(clusterValues(t, "prod", declared.Syncing, now), true)
	if in := k.Input(now); in.State != gc.InputUnknown || !strings.Contains(in.Cause, "syncing") || !in.Since.Equal(now) {
		t.Fatalf("syncing, never complete: %+v", in)
	}
	// Complete and alive: known, its images kept by name with who declares them.
	vals := clusterValues(t, "prod", declared.Complete, now, "docker.io/library/report:7", "docker.io/library/web:2")
	deliver(vals, false)
	kl := k.KeepList()
	if kl.State != gc.InputKnown || !slices.Equal(refsOf(k), []string{"docker.io/library/report:7", "docker.io/library/web:2"}) ||
		kl.Declared["docker.io/library/web:2"] != "CronJob/batch/r" || !slices.Equal(kl.Patterns, []string{"base/*"}) {
		t.Fatalf("complete: %+v %v", kl.Input, refsOf(k))
	}
	if changes == 0 {
		t.Error("no change reported to image GC")
	}
	// The heartbeat stops: stale after three periods (5 s at least), the last list keeps.
	now = now.Add(20 * time.Second)
	if in := k.Input(now); in.State != gc.InputStale || !strings.Contains(in.Cause, "has not said it is alive") || len(refsOf(k)) != 2 {
		t.Fatalf("silent component: %+v %v", in, refsOf(k))
	}
	if d := k.detail(now); !strings.Contains(d, "cluster keep list") {
		t.Errorf("readyz: %q", d)
	}
	// A new leader syncs: stale, the last complete list still keeps; then
	// an incomplete list that lost report:7 still keeps it.
	deliver(clusterValues(t, "prod", declared.Incomplete, now, "docker.io/library/web:2", "docker.io/library/new:1"), false)
	if in := k.Input(now); in.State != gc.InputStale || !strings.Contains(in.Cause, "incomplete") {
		t.Fatalf("incomplete: %+v", in)
	}
	if got := refsOf(k); !slices.Equal(got, []string{"docker.io/library/new:1", "docker.io/library/report:7", "docker.io/library/web:2"}) {
		t.Fatalf("incomplete keeps %v", got)
	}
	// A restart without NATS: the saved complete list keeps.
	k2 := loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clk, zerolog.Nop())
	if got := refsOf(k2); !slices.Contains(got, "docker.io/library/report:7") {
		t.Fatalf("restored %v", got)
	}
	// A value that does not decode never counts: stale, nothing new kept by it.
	k.apply(natsbus.KeepUpdate{Key: declared.ShardKey("prod", 16, 3), Value: []byte(`{"images":[{"n":1}]}`)})
	if in := k.Input(now); in.State != gc.InputStale || !strings.Contains(in.Cause, "not understood") {
		t.Fatalf("undecodable: %+v", in)
	}
	// Complete again and alive: known, the released report:7 goes.
	deliver(clusterValues(t, "prod", declared.Complete, now, "docker.io/library/web:2"), false)
	if in := k.Input(now); in.State != gc.InputKnown || !slices.Equal(refsOf(k), []string{"docker.io/library/web:2"}) {
		t.Fatalf("complete again: %+v %v", in, refsOf(k))
	}
	// A watch made again finds no head (uninstalled): known and empty.
	start()
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*"}}})
	k.apply(natsbus.KeepUpdate{Synced: true})
	if in := k.Input(now); in.State != gc.InputKnown || len(refsOf(k)) != 0 {
		t.Fatalf("no head: %+v %v", in, refsOf(k))
	}
}

// TestClusterKeepOldHeartbeatAtStart: a head read when a watch starts,
// whose heartbeat is older than three periods and the skew allowance, is
// stale at once: the component stopped before this agent looked.
func TestClusterKeepOldHeartbeatAtStart(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, DefaultKeepListWait, func() time.Time { return now }, zerolog.Nop())
	k.seen = map[string]bool{}
	vals := clusterValues(t, "prod", declared.Complete, now.Add(-time.Hour), "docker.io/library/web:2")
	for key, v := range vals {
		k.apply(natsbus.KeepUpdate{Key: key, Value: v})
	}
	k.apply(natsbus.KeepUpdate{Synced: true})
	if in := k.Input(now); in.State != gc.InputUnknown {
		t.Fatalf("an hour-old head on a node that never read the list: %+v (want unknown: never complete and alive here)", in)
	}
	if got := refsOf(k); !slices.Equal(got, []string{"docker.io/library/web:2"}) {
		t.Fatalf("its images still keep: %v", got)
	}
}

// withGrace sets the grace (--release-after) of the head in vals.
func withGrace(t *testing.T, vals map[string][]byte, cluster string, grace time.Duration) map[string][]byte {
	t.Helper()
	var h declared.Head
	if err := json.Unmarshal(vals[declared.HeadKey(cluster)], &h); err != nil {
		t.Fatal(err)
	}
	h.ReleaseAfterS = grace.Seconds()
	vals[declared.HeadKey(cluster)], _ = json.Marshal(h)
	return vals
}

// TestClusterKeepHeadGoneKeepsForGrace (issue 41, NATS restarting without
// its store): a complete list whose head goes (the bucket lost with NATS's
// store, deleted and made again, the head deleted) keeps its images for
// the list's grace from then, stale, also across a restart, as the
// component keeps an image whose last workload went; a head back ends the
// wait; after the grace the list is known and empty. Before, the first
// watch that found no head made the list known and empty at once, so that
// every declared image could go in the seconds before the component wrote
// the list again.
func TestClusterKeepHeadGoneKeepsForGrace(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clk := func() time.Time { return now }
	k := loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clk, zerolog.Nop())
	start := func() { k.mu.Lock(); k.seen = map[string]bool{}; k.watching = false; k.mu.Unlock() }
	deliver := func(vals map[string][]byte) {
		for _, key := range slices.Sorted(maps.Keys(vals)) {
			k.apply(natsbus.KeepUpdate{Key: key, Value: vals[key]})
		}
		k.apply(natsbus.KeepUpdate{Synced: true})
	}
	start()
	deliver(withGrace(t, clusterValues(t, "prod", declared.Complete, now, "docker.io/library/report:7"), "prod", time.Hour))
	if in := k.Input(now); in.State != gc.InputKnown || !slices.Equal(refsOf(k), []string{"docker.io/library/report:7"}) {
		t.Fatalf("complete: %+v %v", in, refsOf(k))
	}
	// NATS comes back without its store: the watch finds no bucket.
	now = now.Add(time.Minute)
	gone := now
	start()
	k.apply(natsbus.KeepUpdate{Synced: true})
	if in := k.Input(now); in.State != gc.InputStale || !strings.Contains(in.Cause, "no head") || !slices.Equal(refsOf(k), []string{"docker.io/library/report:7"}) {
		t.Fatalf("head gone: %+v %v (want stale, keeping report:7 for the grace)", in, refsOf(k))
	}
	if st := k.cl.state(now); st != "gone" {
		t.Errorf("cluster state %q during the grace, want gone (the alert's)", st)
	}
	// A restart within the grace keeps it, and counts from when the head went.
	now = now.Add(30 * time.Minute)
	k = loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clk, zerolog.Nop())
	start()
	k.apply(natsbus.KeepUpdate{Synced: true})
	if got := refsOf(k); !slices.Equal(got, []string{"docker.io/library/report:7"}) {
		t.Fatalf("restarted within the grace: %v", got)
	}
	// The grace ends: known and empty.
	now = gone.Add(time.Hour)
	k.apply(natsbus.KeepUpdate{Alive: true}) // the watch goes on
	if got := refsOf(k); len(got) != 0 {
		t.Fatalf("after the grace: %v", got)
	}
	if in := k.Input(now); in.State != gc.InputKnown {
		t.Fatalf("after the grace: %+v", in)
	}
	// A head back (the component wrote it again) ends any wait.
	start()
	deliver(withGrace(t, clusterValues(t, "prod", declared.Complete, now, "docker.io/library/web:2"), "prod", time.Hour))
	now = now.Add(time.Minute)
	start()
	k.apply(natsbus.KeepUpdate{Synced: true})
	deliver(withGrace(t, clusterValues(t, "prod", declared.Complete, now, "docker.io/library/web:2"), "prod", time.Hour))
	now = now.Add(2 * time.Hour)
	start()
	k.apply(natsbus.KeepUpdate{Synced: true})
	if in := k.Input(now); in.State != gc.InputStale || !slices.Equal(refsOf(k), []string{"docker.io/library/web:2"}) {
		t.Fatalf("a head gone again, counted from then: %+v %v", in, refsOf(k))
	}
}

// TestFleetKeepBucketGoneKeepsTheLastList (review of issue 41: the
// operator's keys as exposed as the cluster's): a bucket that goes after
// a list was read from it (NATS restarted without its store) keeps the
// last list, stale, where it used to be a known empty list at once; a
// NATS that never had one is still known empty.
func TestFleetKeepBucketGoneKeepsTheLastList(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, DefaultKeepListWait, func() time.Time { return now }, zerolog.Nop())
	if k.heldAList() {
		t.Fatal("a fresh agent holds a list")
	}
	k.seen = map[string]bool{}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"app:*"}}})
	k.apply(natsbus.KeepUpdate{Synced: true})
	if !k.heldAList() {
		t.Fatal("a list read is not held")
	}
	k.fail(fmt.Errorf("gone: %w", jetstream.ErrBucketNotFound), time.Second)
	now = now.Add(time.Minute)
	l := k.KeepList()
	if l.State != gc.InputStale || !slices.Equal(l.Patterns, []string{"app:*"}) {
		t.Fatalf("bucket gone: %+v, want the last list, stale", l)
	}
}
