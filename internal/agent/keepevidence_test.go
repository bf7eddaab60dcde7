package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// makeKeepStore makes, in stateDir, the directory the embedded server
// keeps the keep list bucket in.
func makeKeepStore(t *testing.T, stateDir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(stateDir, "nats", "jetstream", "$G", "streams", "KV_"+natsbus.KeepBucket), 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestFleetKeepOwnStore: on the embedded server the keep list lives in
// the agent's own store. A store without the bucket holds no list: known
// empty at start, and image deletes never wait (also when a list saved
// from another NATS is there: it no longer applies). A store with it
// holds the list the agent saved: while the server does not run nothing
// can change it, so it is known; once the server runs, it is as old as
// the agent's last confirmation until the watch reads it. A store with the
// bucket but no copy saved from it stays unknown. On d7dd547 a first start
// with the port taken left the list unknown and image deletes waited
// --keep-list-wait, and a saved list was only ever stale.
func TestFleetKeepOwnStore(t *testing.T) {
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	own := keepSource(Config{Cluster: "prod"})
	fleet := keepSource(Config{Cluster: "prod", NATSURL: "nats://fleet.example:4222"})
	waits := func(k *fleetKeep) bool {
		_, waiting := gc.ImagePolicy{FleetKeep: k.KeepList(), FleetKeepWait: 5 * time.Minute}.KeepListWait(now)
		return waiting
	}
	save := func(dir, source string, patterns ...string) {
		t.Helper()
		k := loadFleetKeep(dir, "prod", source, 5*time.Minute, clock, zerolog.Nop())
		k.seen = map[string]bool{}
		k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: patterns}})
		k.apply(natsbus.KeepUpdate{Synced: true})
	}

	t.Run("no store", func(t *testing.T) {
		now = start
		k := loadFleetKeep(t.TempDir(), "prod", own, 5*time.Minute, clock, zerolog.Nop())
		if l := k.KeepList(); l.State != gc.InputKnown || len(l.Patterns) != 0 || !k.everRead() || waits(k) {
			t.Errorf("first start on the embedded server: %+v, read %v, waits %v; want known empty, nothing waits", l, k.everRead(), waits(k))
		}
		if s := k.Setting(now); !strings.Contains(s.Source, "holds no bucket") {
			t.Errorf("setting %+v", s)
		}
		k.setOwnServer(func() bool { return true }) // the server cannot start
		now = start.Add(time.Hour)
		if l := k.KeepList(); l.State != gc.InputKnown {
			t.Errorf("an hour on with the server down: %+v, want known", l)
		}
	})
	t.Run("no store, a list saved from another NATS", func(t *testing.T) {
		now = start
		dir := t.TempDir()
		save(dir, fleet, "fleet/*")
		k := loadFleetKeep(dir, "prod", own, 5*time.Minute, clock, zerolog.Nop())
		if l := k.KeepList(); l.State != gc.InputKnown || len(l.Patterns) != 0 || waits(k) {
			t.Errorf("%+v: want known empty", l)
		}
	})
	t.Run("store and its saved copy", func(t *testing.T) {
		now = start
		dir := t.TempDir()
		save(dir, own, "local/*")
		makeKeepStore(t, dir)
		now = start.Add(time.Hour)
		k := loadFleetKeep(dir, "prod", own, 5*time.Minute, clock, zerolog.Nop())
		down := true
		k.setOwnServer(func() bool { return down })
		if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, []string{"local/*"}) || waits(k) {
			t.Errorf("server down: %+v, want known with the saved patterns", l)
		}
		if s := k.Setting(now); !strings.Contains(s.Source, "the embedded server's store") {
			t.Errorf("setting %+v", s)
		}
		down = false
		if l := k.KeepList(); l.State != gc.InputStale || !slices.Equal(l.Patterns, []string{"local/*"}) || waits(k) {
			t.Errorf("server up, not read yet: %+v, want stale with the saved patterns", l)
		}
	})
	t.Run("store without a saved copy", func(t *testing.T) {
		now = start
		dir := t.TempDir()
		makeKeepStore(t, dir)
		k := loadFleetKeep(dir, "prod", own, 5*time.Minute, clock, zerolog.Nop())
		k.setOwnServer(func() bool { return true })
		if l := k.KeepList(); l.State != gc.InputUnknown || !waits(k) {
			t.Errorf("%+v: want unknown, deletes waiting", l)
		}
	})
	t.Run("another NATS", func(t *testing.T) {
		now = start
		k := loadFleetKeep(t.TempDir(), "prod", fleet, 5*time.Minute, clock, zerolog.Nop())
		if l := k.KeepList(); l.State != gc.InputUnknown || !waits(k) {
			t.Errorf("a fleet NATS never read: %+v, want unknown", l)
		}
	})
}

// TestFleetKeepUndecodableValue: on a node that never read the list, a
// key whose value does not decode leaves the list unknown (image deletes
// wait for it) even once the watch has delivered every key, and says why;
// when the key holds a value the agent understands, the list is read.
// Once read, a value not understood keeps the key's last list and makes
// the list stale, never known. On d7dd547 the watch's sync made the list
// known and empty, and image GC deleted what the value named.
func TestFleetKeepUndecodableValue(t *testing.T) {
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	now := start
	var logs bytes.Buffer
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, func() time.Time { return now }, zerolog.New(&logs))
	settled := 0
	k.settled = func() { settled++ }
	_, err := natsbus.DecodeKeep([]byte(`{"images":["registry.example/app:*"]}`))
	if err == nil {
		t.Fatal("a value without patterns decodes")
	}
	k.seen = map[string]bool{}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, Err: err})
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepClusterKey("prod"), List: natsbus.KeepList{Patterns: []string{"app:*"}}})
	k.apply(natsbus.KeepUpdate{Synced: true})
	now = start.Add(time.Second)
	l := k.KeepList()
	if l.State != gc.InputUnknown || k.everRead() || !strings.Contains(l.Cause, "value of key all not understood") {
		t.Errorf("a key not understood on a node never read: %+v (read %v), want unknown naming the key", l, k.everRead())
	}
	if _, waiting := (gc.ImagePolicy{FleetKeep: l, FleetKeepWait: 5 * time.Minute}).KeepListWait(now); !waiting || settled != 0 {
		t.Errorf("image deletes do not wait (settled %d)", settled)
	}
	if d := k.detail(now); !strings.Contains(d, "never read (value of key all not understood") {
		t.Errorf("/readyz %q", d)
	}
	if n := countLogged(logLines(t, &logs), "warn", "fleet keep list value not understood, never read"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, Err: err}) // delivered again: not logged again
	if n := countLogged(logLines(t, &logs), "warn", "fleet keep list value not understood"); n != 1 {
		t.Errorf("%d warnings after the same value again, want 1", n)
	}

	// The key is written right: read, and what waited for it may go.
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*"}}})
	if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, []string{"app:*", "base/*"}) || !k.everRead() || settled != 1 {
		t.Errorf("fixed: %+v (settled %d)", l, settled)
	}
	// Written wrongly again: its last list keeps, stale.
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, Err: errors.New("keep list value: no \"patterns\" key")})
	if l := k.KeepList(); l.State != gc.InputStale || !slices.Equal(l.Patterns, []string{"app:*", "base/*"}) || !strings.Contains(l.Cause, "keeping its last list") {
		t.Errorf("read, then not understood: %+v, want stale with the last patterns", l)
	}
	k.confirm() // heartbeats do not confirm a list with a key not understood
	now = now.Add(time.Second)
	if l := k.KeepList(); l.State != gc.InputStale {
		t.Errorf("confirmed with a key not understood: %+v", l)
	}
}

// TestFleetKeepInvalidPattern: a fleet pattern path.Match refuses keeps
// every image whose name starts with its literal text before the first
// glob character (as stored or in its familiar form, at any depth below
// it; every image when that text is empty); it is logged once, named in
// /readyz and counted in gcagent_keep_list_invalid_patterns, and the
// list's other patterns still apply. On d7dd547 it protected nothing.
func TestFleetKeepInvalidPattern(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, func() time.Time { return now }, zerolog.New(&logs))
	k.seen = map[string]bool{}
	list := natsbus.KeepList{Patterns: []string{"registry.example/app:1.[2", "nginx:1.[2", "registry.example/te[am", "base/*"}}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: list})
	k.apply(natsbus.KeepUpdate{Synced: true})
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: list}) // again: logged once
	covered := func(name string) bool {
		l := k.KeepList()
		for _, p := range l.Patterns {
			if gc.ValidKeepPattern(p) != nil {
				t.Fatalf("pattern in force %q is invalid", p)
			}
			if gc.KeepCovers(p, name) {
				return true
			}
		}
		for _, p := range l.Prefixes {
			if gc.PrefixKeeps(p, name) {
				return true
			}
		}
		return false
	}
	for name, want := range map[string]bool{
		"registry.example/app:1.25":           true,
		"registry.example/app:2.0":            false,
		"docker.io/library/nginx:1.25":        true,
		"docker.io/library/nginx:2":           false,
		"registry.example/team/sub/app:1":     true,
		"registry.example/team/a/b/c/d/e/f:1": true,
		"registry.example/tools:1":            false,
		"base/x:1":                            true,
		"other.example/app:1":                 false,
	} {
		if got := covered(name); got != want {
			t.Errorf("%s kept %v, want %v (patterns %v)", name, got, want, k.Patterns())
		}
	}
	if n := countLogged(logLines(t, &logs), "warn", "fleet keep list pattern invalid"); n != 3 {
		t.Errorf("%d warnings for 3 invalid patterns:\n%s", n, logs.String())
	}
	if d := k.detail(now); !strings.Contains(d, `fleet keep list: pattern "registry.example/app:1.[2" of key all is invalid`) ||
		!strings.Contains(d, `it keeps every image whose name starts with "registry.example/app:1."`) {
		t.Errorf("/readyz %q", d)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(keepMetrics{k})
	if v, err := testutil.GatherAndCount(reg, "gcagent_keep_list_invalid_patterns"); err != nil || v != 1 {
		t.Fatalf("gauge series %d %v", v, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "gcagent_keep_list_invalid_patterns" && mf.GetMetric()[0].GetGauge().GetValue() != 3 {
			t.Errorf("gauge %v, want 3", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// An empty literal prefix keeps every image.
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"[oops"}}})
	for _, name := range []string{"sha256:0123", "a:1", "docker.io/library/busybox:1", "r.example/a/b/c:1"} {
		if !covered(name) {
			t.Errorf("%s not kept by an invalid pattern without literal text", name)
		}
	}
}

// TestFleetKeepWatchStalls: the bucket is removed and made again with
// another value within the watch's heartbeat. The agent's watch, which
// confirms the list only at the server's heartbeats, stalls, is made
// again and reads the new value. On d7dd547 the watch resumed after the
// last sequence it had seen and never saw the value (the list also
// counted as confirmed all along, the connection being up).
func TestFleetKeepWatchStalls(t *testing.T) {
	s := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: s.ClientURL(), Cluster: "prod", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	put := func(p string) {
		t.Helper()
		kv, err := natsbus.EnsureKeepBucket(ctx, js, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := natsbus.EditKeep(ctx, kv, natsbus.KeepClusterKey("prod"), "op", time.Now, func([]string) ([]string, error) { return []string{p}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	put("old/a:*")
	put("old/b:*")
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, time.Now, zerolog.Nop())
	k.heartbeat = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- k.run(ctx, nc, "", false) }()
	want := func(p string) {
		t.Helper()
		wait.For(t, 30*time.Second, func() string {
			if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, []string{p}) {
				return fmt.Sprintf("list %+v, want known [%s]", l, p)
			}
			return ""
		})
	}
	want("old/b:*")
	if err := js.DeleteKeyValue(ctx, natsbus.KeepBucket); err != nil {
		t.Fatal(err)
	}
	put("new/c:*")
	want("new/c:*")
	if v := testutil.ToFloat64(k.failures.WithLabelValues(natsbus.KeepCauseStalled)); v < 1 {
		t.Errorf("stalled watches counted %v", v)
	}
	cancel()
	<-done
}
