package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// TestFleetKeepFollowsTheWatchAndPersists: the agent applies its
// cluster's and the all-clusters key, ignores other clusters, keeps by
// an invalid pattern's literal prefix, forgets keys gone while it was
// away, and restores the last list from its state dir with the time NATS
// last confirmed it.
func TestFleetKeepFollowsTheWatchAndPersists(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	k := loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clock, zerolog.Nop())
	changes, settled := 0, 0
	k.changed = func() { changes++ }
	k.settled = func() { settled++ }
	k.seen = map[string]bool{}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*", "legacy/app:[bad"}}})
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepClusterKey("prod"), List: natsbus.KeepList{Patterns: []string{"app:*"}}})
	k.apply(natsbus.KeepUpdate{Synced: true})
	// Two changes of the patterns; the first read changed none.
	if got := k.Patterns(); !slices.Equal(got, []string{"app:*", "base/*"}) || !slices.Equal(k.KeepList().Prefixes, []string{"legacy/app:"}) || changes != 2 || settled != 1 {
		t.Fatalf("patterns %v, prefixes %v after %d changes, %d settled", got, k.KeepList().Prefixes, changes, settled)
	}
	if age, ok := k.Age(now.Add(90 * time.Second)); !ok || age != 90*time.Second || k.detail(now.Add(90*time.Second)) == "" {
		t.Fatalf("age %s %v, detail %q", age, ok, k.detail(now.Add(90*time.Second)))
	}

	now = now.Add(time.Hour) // a restart without NATS keeps the list and its age
	k2 := loadFleetKeep(dir, "prod", testKeepSource, DefaultKeepListWait, clock, zerolog.Nop())
	if got := k2.Patterns(); !slices.Equal(got, []string{"app:*", "base/*"}) || !slices.Equal(k2.KeepList().Prefixes, []string{"legacy/app:"}) {
		t.Fatalf("restored %v %v", got, k2.KeepList().Prefixes)
	}
	if age, ok := k2.Age(now); !ok || age != time.Hour {
		t.Fatalf("restored age %s %v", age, ok)
	}
	// The watch delivers only the all-clusters key now: prod's was deleted.
	k2.seen = map[string]bool{}
	k2.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*"}}})
	k2.apply(natsbus.KeepUpdate{Synced: true})
	if got := k2.Patterns(); !slices.Equal(got, []string{"base/*"}) {
		t.Fatalf("after the resync %v", got)
	}
	if age, _ := k2.Age(now); age != 0 || k2.detail(now) != "" {
		t.Fatalf("age %s after a resync", age)
	}
	if s := k2.Setting(now); s.Name != "fleet-keep" || s.Value != "base/*" {
		t.Fatalf("setting %+v", s)
	}
}

// logLines decodes the JSON lines a zerolog logger wrote to b.
func logLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// countLogged counts the lines whose message starts with msg.
func countLogged(lines []map[string]any, level, msg string) int {
	n := 0
	for _, l := range lines {
		if l["level"] == level && strings.HasPrefix(fmt.Sprint(l["message"]), msg) {
			n++
		}
	}
	return n
}

// TestFleetKeepStates: a list never read is unknown since the agent
// started, and image deletes wait for it (/readyz line, gauge); read, it
// is known; unconfirmed for three heartbeats, stale; restored from the state dir,
// it is what it was (never unknown again). Each state reaches image GC
// with the patterns (KeepList).
func TestFleetKeepStates(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	k := loadFleetKeep(dir, "prod", testKeepSource, 5*time.Minute, clock, zerolog.Nop())
	metric := func(name string) float64 {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(keepMetrics{k})
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				id := mf.GetName()
				for _, l := range m.GetLabel() {
					id += "{" + l.GetName() + "=" + l.GetValue() + "}"
				}
				if id == name {
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}

	now = start.Add(time.Minute)
	l := k.KeepList()
	if l.State != gc.InputUnknown || !l.Since.Equal(start) || l.Patterns != nil || l.Cause != "not read from NATS yet" {
		t.Fatalf("never read: %+v", l)
	}
	if d := k.detail(now); !strings.Contains(d, "never read (not read from NATS yet); image deletes by threshold or maximum age wait for it until 2026-11-26T12:05:00Z (--keep-list-wait 5m0s)") {
		t.Errorf("/readyz line %q", d)
	}
	if metric("gcagent_keep_list_waiting") != 1 || metric("gcagent_keep_list_state{state=unknown}") != 1 || metric("gcagent_keep_list_state{state=known}") != 0 {
		t.Error("gauges do not say image deletes wait for a list never read")
	}
	k.fail(context.DeadlineExceeded, time.Second)
	if l := k.KeepList(); l.Cause != "timeout: context deadline exceeded" {
		t.Errorf("cause %q", l.Cause)
	}
	now = start.Add(5 * time.Minute)
	if d := k.detail(now); !strings.Contains(d, "the wait ended at 2026-11-26T12:05:00Z: image GC goes on with --keep-image only") || metric("gcagent_keep_list_waiting") != 0 {
		t.Errorf("after the wait: /readyz line %q, waiting %v", d, metric("gcagent_keep_list_waiting"))
	}

	k.seen = map[string]bool{}
	k.recovered()
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepClusterKey("prod"), List: natsbus.KeepList{Patterns: []string{"app:*"}}})
	if l := k.KeepList(); l.State != gc.InputUnknown || !slices.Equal(l.Patterns, []string{"app:*"}) {
		t.Errorf("a value before the watch synced: %+v (unknown, with the pattern)", l)
	}
	k.apply(natsbus.KeepUpdate{Synced: true})
	if l := k.KeepList(); l.State != gc.InputKnown || !l.Since.Equal(now) || k.detail(now) != "" || metric("gcagent_keep_list_state{state=known}") != 1 {
		t.Errorf("read: %+v, /readyz %q", l, k.detail(now))
	}
	now = now.Add(keepStaleAfter)
	if l := k.KeepList(); l.State != gc.InputStale || !slices.Equal(l.Patterns, []string{"app:*"}) || l.Cause != "not confirmed by NATS for "+keepStaleAfter.String() {
		t.Errorf("unconfirmed for three heartbeats: %+v", l)
	}
	if d := k.detail(now); !strings.Contains(d, "keeping the last list seen (1 patterns)") {
		t.Errorf("stale /readyz line %q", d)
	}

	// A restart: the saved list is stale, never unknown; nothing waits.
	now = now.Add(time.Hour)
	k2 := loadFleetKeep(dir, "prod", testKeepSource, 5*time.Minute, clock, zerolog.Nop())
	if l := k2.KeepList(); l.State != gc.InputStale || !slices.Equal(l.Patterns, []string{"app:*"}) {
		t.Errorf("restored: %+v", l)
	}
	if !k2.everRead() {
		t.Error("a restored list counts as never read")
	}
	// An unreadable file is no list: unknown.
	if err := os.WriteFile(filepath.Join(dir, KeepListFile), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l := loadFleetKeep(dir, "prod", testKeepSource, 5*time.Minute, clock, zerolog.Nop()).KeepList(); l.State != gc.InputUnknown {
		t.Errorf("unreadable file: %+v", l)
	}
}

// TestFleetKeepAwaitRead: one line says image deletes wait; when the wait
// ends without a read, one warning says GC goes on with --keep-image only
// and image GC is nudged; a read within the wait ends it quietly.
func TestFleetKeepAwaitRead(t *testing.T) {
	for _, read := range []bool{false, true} {
		var logs bytes.Buffer
		fake := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
		k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, fake.Now, zerolog.New(&logs))
		nudged := make(chan struct{}, 4)
		k.settled = func() { nudged <- struct{}{} }
		done := make(chan struct{})
		go func() { k.awaitRead(context.Background(), fake); close(done) }()
		<-fake.Arms() // armed at the wait's end
		if read {
			k.seen = map[string]bool{}
			k.apply(natsbus.KeepUpdate{Synced: true})
		} else {
			fake.Step(5 * time.Minute)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("awaitRead did not return")
		}
		lines := logLines(t, &logs)
		if n := countLogged(lines, "info", "no fleet keep list saved: image deletes by threshold or maximum age wait"); n != 1 {
			t.Errorf("read %v: %d lines saying deletes wait, want 1:\n%s", read, n, logs.String())
		}
		warned := countLogged(lines, "warn", "fleet keep list not read within --keep-list-wait")
		if read && (warned != 0 || len(nudged) != 1 || countLogged(lines, "info", "fleet keep list read from NATS for the first time") != 1) {
			t.Errorf("read within the wait:\n%s", logs.String())
		}
		if !read && (warned != 1 || len(nudged) != 1) {
			t.Errorf("the wait ended: %d warnings, %d nudges:\n%s", warned, len(nudged), logs.String())
		}
	}
}

// TestFleetKeepFailuresLoggedOncePerCause: a watch failing every second
// is counted each time, logged once per cause (an error for a server too
// old, naming the version), and again only after it worked once more.
func TestFleetKeepFailuresLoggedOncePerCause(t *testing.T) {
	var logs bytes.Buffer
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, func() time.Time { return now }, zerolog.New(&logs))
	old := &natsbus.ServerTooOld{Feature: "the fleet keep list watch", Version: "2.8.4", Need: natsbus.MinServerVersion}
	for range 10 {
		k.fail(fmt.Errorf("watch: %w", nats.ErrTimeout), time.Second)
		k.fail(old, time.Second)
		now = now.Add(time.Second)
	}
	if v := testutil.ToFloat64(k.failures.WithLabelValues(natsbus.KeepCauseTimeout)); v != 10 {
		t.Errorf("timeouts counted %v, want 10", v)
	}
	if v := testutil.ToFloat64(k.failures.WithLabelValues(natsbus.KeepCauseServerTooOld)); v != 10 {
		t.Errorf("server-too-old counted %v, want 10", v)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(k.failures)
	if n, err := testutil.GatherAndCount(reg, "gcagent_keep_list_watch_failures_total"); err != nil || n != len(natsbus.KeepWatchCauses) {
		t.Errorf("%d failure series (%v), want one per cause from the start", n, err)
	}
	lines := logLines(t, &logs)
	if n := countLogged(lines, "warn", "fleet keep list not watched"); n != 1 {
		t.Errorf("%d warnings for timeouts, want 1:\n%s", n, logs.String())
	}
	if n := countLogged(lines, "error", "fleet keep list not watched"); n != 1 || !strings.Contains(logs.String(), "needs "+natsbus.MinServerVersion+" or later") {
		t.Errorf("%d errors for the server version, want 1 naming %s:\n%s", n, natsbus.MinServerVersion, logs.String())
	}
	k.recovered()
	k.fail(nats.ErrTimeout, time.Second)
	lines = logLines(t, &logs)
	if countLogged(lines, "info", "fleet keep list watched again") != 1 || countLogged(lines, "warn", "fleet keep list not watched") != 2 {
		t.Errorf("after a recovery:\n%s", logs.String())
	}
}

// TestFleetKeepRunOnEveryServer: the agent's watch reads its cluster's
// and the all-clusters key, and follows a change, on the Go module's
// server and on Debian's nats-server 2.9.10 (the oldest supported, which
// refuses a consumer with several filter subjects). It counts no failure.
func TestFleetKeepRunOnEveryServer(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"go-module": func(t *testing.T) string {
			return testenv.StartNATS(t, testenv.NATSOptions{JetStream: true}).ClientURL()
		},
		"debian": func(t *testing.T) string { return testenv.StartDebianNATS(t, testenv.DebianNATSOptions{}).URL },
	} {
		t.Run(name, func(t *testing.T) {
			nc, err := natsbus.Connect(natsbus.ConnOptions{URL: url(t), Cluster: "prod", Node: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			js, _ := jetstream.New(nc)
			kv, err := natsbus.EnsureKeepBucket(ctx, js, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			add := func(key, p string) {
				t.Helper()
				if _, err := natsbus.EditKeep(ctx, kv, key, "test", time.Now, func(l []string) ([]string, error) { return append(l, p), nil }); err != nil {
					t.Fatal(err)
				}
			}
			add(natsbus.KeepAllKey, "base/*")
			add(natsbus.KeepClusterKey("prod"), "app:*")
			add(natsbus.KeepClusterKey("staging"), "other:*")
			k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, time.Now, zerolog.Nop())
			done := make(chan error, 1)
			go func() { done <- k.run(ctx, nc, "", false) }()
			want := func(patterns ...string) {
				t.Helper()
				wait.For(t, 20*time.Second, func() string {
					if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, patterns) {
						return fmt.Sprintf("list %+v, want known %v", l, patterns)
					}
					return ""
				})
			}
			want("app:*", "base/*")
			add(natsbus.KeepClusterKey("prod"), "db:*")
			want("app:*", "base/*", "db:*")
			for _, c := range natsbus.KeepWatchCauses {
				if c == natsbus.KeepCauseBucketNotFound {
					continue
				}
				if v := testutil.ToFloat64(k.failures.WithLabelValues(c)); v != 0 {
					t.Errorf("%v watch failures of cause %s", v, c)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFleetKeepReadWhenNATSComesBack: NATS does not answer when the agent
// starts: the list stays unknown (one warning), and is read as soon as
// the server is up, not at the next backoff step.
func TestFleetKeepReadWhenNATSComesBack(t *testing.T) {
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var logs syncBuffer
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: url, Cluster: "prod", Node: "n1", ReconnectMin: 50 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	k := loadFleetKeep(t.TempDir(), "prod", testKeepSource, 5*time.Minute, time.Now, zerolog.New(&logs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.run(ctx, nc, "", false) }()
	wait.For(t, 30*time.Second, func() string {
		if l := k.KeepList(); l.State != gc.InputUnknown || l.Cause == "not read from NATS yet" {
			return fmt.Sprintf("list %+v, want unknown with the failure's cause", l)
		}
		return ""
	})
	// Let the backoff grow past what the test waits below.
	wait.For(t, 60*time.Second, func() string {
		if n := sumFailures(k); n < 2 {
			return fmt.Sprintf("%v failures so far", n)
		}
		return ""
	})
	s := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true, Port: port})
	up := time.Now()
	snc, err := natsbus.Connect(natsbus.ConnOptions{URL: s.ClientURL(), Cluster: "prod", Node: "op"})
	if err != nil {
		t.Fatal(err)
	}
	defer snc.Close()
	js, _ := jetstream.New(snc)
	kv, err := natsbus.EnsureKeepBucket(ctx, js, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsbus.EditKeep(ctx, kv, natsbus.KeepClusterKey("prod"), "op", time.Now, func([]string) ([]string, error) { return []string{"app:*"}, nil }); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, func() string {
		if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, []string{"app:*"}) {
			return fmt.Sprintf("list %+v after NATS came up", l)
		}
		return ""
	})
	t.Logf("read %s after the server came up, after %v failed watches", time.Since(up).Round(time.Millisecond), sumFailures(k))
	lines := logLines(t, logs.buffer())
	if n := countLogged(lines, "warn", "fleet keep list not watched"); n != 1 {
		t.Errorf("%d warnings for %v failures, want 1:\n%s", n, sumFailures(k), logs.buffer())
	}
	cancel()
	<-done
}

func sumFailures(k *fleetKeep) float64 {
	n := 0.0
	for _, c := range natsbus.KeepWatchCauses {
		if c != natsbus.KeepCauseBucketNotFound {
			n += testutil.ToFloat64(k.failures.WithLabelValues(c))
		}
	}
	return n
}

// freePort is a loopback port free just now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a log sink written by the watch's goroutine and read by
// the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) buffer() *bytes.Buffer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.NewBuffer(slices.Clone(s.b.Bytes()))
}

// testKeepSource is where the tests' agents read the fleet keep list.
const testKeepSource = "nats nats://127.0.0.1:4222, key cluster.prod"

// TestFleetKeepFromAnotherSource: a list saved from another NATS (the
// embedded server before a move to the fleet's, another cluster's key, a
// file of a version that did not say where it read it) keeps by its
// patterns, but is not this source's: unknown, and image deletes wait for
// this source's list as for one never read. Read from this source, it is
// saved as its, and the next start restores it as read.
func TestFleetKeepFromAnotherSource(t *testing.T) {
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	embedded := keepSource(Config{Cluster: "prod"})
	fleet := keepSource(Config{Cluster: "prod", NATSURL: "nats://keeper:s3cret@fleet.example:4222, nats://b.example:4222"})
	if strings.Contains(fleet, "s3cret") || fleet == embedded || fleet == keepSource(Config{Cluster: "prod", NATSURL: "nats://fleet.example:4222"}) {
		t.Fatalf("sources: embedded %q, fleet %q", embedded, fleet)
	}
	if keepSource(Config{Cluster: "dev", NATSURL: "nats://fleet.example:4222"}) == keepSource(Config{Cluster: "prod", NATSURL: "nats://fleet.example:4222"}) {
		t.Fatal("two clusters' keys are one source")
	}
	for name, save := range map[string]func(dir string){
		"embedded server": func(dir string) {
			k := loadFleetKeep(dir, "prod", embedded, 5*time.Minute, clock, zerolog.Nop())
			k.seen = map[string]bool{}
			k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"local/*"}}})
			k.apply(natsbus.KeepUpdate{Synced: true}) // confirmed, and saved
		},
		"no source recorded": func(dir string) {
			b, _ := json.Marshal(keepDoc{Lists: map[string]natsbus.KeepList{natsbus.KeepAllKey: {Patterns: []string{"local/*"}}}, ConfirmedAt: now})
			if err := os.WriteFile(filepath.Join(dir, KeepListFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			now = start
			save(dir)
			now = start.Add(time.Hour)
			k := loadFleetKeep(dir, "prod", fleet, 5*time.Minute, clock, zerolog.Nop())
			if l := k.KeepList(); l.State != gc.InputUnknown || !l.Since.Equal(now) || !slices.Equal(l.Patterns, []string{"local/*"}) {
				t.Errorf("restored from another source: %+v, want unknown since the start, its patterns kept", l)
			}
			if k.everRead() {
				t.Error("a list of another source counts as read: image GC would not wait for this one's")
			}
			p := gc.ImagePolicy{FleetKeep: k.KeepList(), FleetKeepWait: 5 * time.Minute}
			if _, waiting := p.KeepListWait(now.Add(time.Minute)); !waiting {
				t.Error("image deletes do not wait for this source's list")
			}
			// This source answers: read, saved as its own.
			k.seen = map[string]bool{}
			k.apply(natsbus.KeepUpdate{Key: natsbus.KeepClusterKey("prod"), List: natsbus.KeepList{Patterns: []string{"app:*"}}})
			k.apply(natsbus.KeepUpdate{Synced: true})
			if l := k.KeepList(); l.State != gc.InputKnown || !slices.Equal(l.Patterns, []string{"app:*"}) {
				t.Errorf("read from this source: %+v", l)
			}
			k2 := loadFleetKeep(dir, "prod", fleet, 5*time.Minute, clock, zerolog.Nop())
			if !k2.everRead() || !slices.Equal(k2.Patterns(), []string{"app:*"}) {
				t.Errorf("restart on the same source: read %v, patterns %v", k2.everRead(), k2.Patterns())
			}
			b, _ := os.ReadFile(filepath.Join(dir, KeepListFile))
			if strings.Contains(string(b), "s3cret") {
				t.Errorf("the saved list holds the NATS password:\n%s", b)
			}
		})
	}
}
