package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/testenv"
)

// keepServers are the servers the store's behaviour is tried on: the
// go.mod's and Debian's 2.9.10, the oldest gcagent supports.
var keepServers = []string{"go-module", "debian-2.9.10"}

// keepStore is a NATS server of kind (keepServers) with the keep list's
// bucket, as the component makes it.
func keepStore(t *testing.T, kind string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	var url string
	switch kind {
	case "go-module":
		url = testenv.StartNATS(t, testenv.NATSOptions{JetStream: true}).ClientURL()
	case "debian-2.9.10":
		url = testenv.StartDebianNATS(t, testenv.DebianNATSOptions{}).URL
	default:
		t.Fatalf("server kind %q", kind)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := ensureKeepBucket(context.Background(), js, 1)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// testReplica is one replica's keep-sync (no informers: complete) and
// publisher, writing cluster "t" as identity.
func testReplica(kv jetstream.KeyValue, identity string, c clock.Timers) (*publisher, *keepSync) {
	cfg := Config{Cluster: "t", Identity: identity, ReleaseAfter: time.Hour, Heartbeat: 30 * time.Second}
	m := newMetrics(prometheus.NewRegistry(), nil)
	ks := newKeepSync(cfg, c, m, zerolog.Nop())
	return newPublisher(cfg, kv, ks, c, m, zerolog.Nop()), ks
}

func declare(ks *keepSync, kind, name string, now time.Time, images ...string) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.set.Put(declared.Workload{Kind: kind, Namespace: "ns", Name: name}, images, now)
}

// sameShard returns n references that fall in one shard of the smallest
// layout.
func sameShard(n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		ref := fmt.Sprintf("docker.io/library/img%d:1", i)
		if declared.ShardOf(ref, declared.MinShards) == 0 {
			out = append(out, ref)
		}
	}
	return out
}

// readList reads cluster "t"'s list as an agent assembles it.
func readList(t *testing.T, kv jetstream.KeyValue) declared.List {
	t.Helper()
	ctx := context.Background()
	e, err := kv.Get(ctx, declared.HeadKey("t"))
	if err != nil {
		return declared.List{}
	}
	h, err := declared.DecodeHead(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string]declared.Shard{}
	for i := range h.Shards {
		key := declared.ShardKey("t", h.Shards, i)
		if se, err := kv.Get(ctx, key); err == nil {
			if s, err := declared.DecodeShard(se.Value()); err == nil {
				shards[key] = s
			}
		}
	}
	return declared.Assemble("t", &h, shards)
}

// TestPublishStaleLeaderLeavesShards (issue 41, two leaders for a
// moment): a leader that has not noticed it lost (frozen past its Lease,
// cut off from the API server) and publishes a change finds out before it
// writes a shard; the new leader's shards stay as it wrote them, and so
// does the image only it knows. Before, the old leader's shard write went
// through (only the head was compare-and-set) and the new leader, holding
// that shard as written, never wrote it again: a declared image was off a
// complete, alive list for as long as that shard did not change.
func TestPublishStaleLeaderLeavesShards(t *testing.T) {
	for _, kind := range keepServers {
		t.Run(kind, func(t *testing.T) {
			_, kv := keepStore(t, kind)
			ctx := context.Background()
			clk := clock.NewFake(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
			refs := sameShard(3) // old, new (declared while a was frozen), late (seen by a only)
			a, aks := testReplica(kv, "replica-a", clk)
			declare(aks, "Deployment", "old", clk.Now(), refs[0])
			if err := a.seed(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := a.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			// a freezes; b takes the Lease, reads the list and publishes what its
			// informers hold: a Deployment made meanwhile.
			b, bks := testReplica(kv, "replica-b", clk)
			declare(bks, "Deployment", "old", clk.Now(), refs[0])
			declare(bks, "Deployment", "new", clk.Now(), refs[1])
			if err := b.seed(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			// a thaws and publishes a change of its own before its election says
			// it lost.
			declare(aks, "Job", "late", clk.Now(), refs[2])
			if _, err := a.publish(ctx, false); !errors.Is(err, errOtherWriter) {
				t.Fatalf("the old leader's publish: %v, want errOtherWriter", err)
			}
			if l := readList(t, kv); !slices.Contains(l.Patterns(), refs[1]) || slices.Contains(l.Patterns(), refs[2]) {
				t.Fatalf("right after the old leader's publish: %v (want %s, not %s: it wrote no shard)", l.Patterns(), refs[1], refs[2])
			}
			clk.Step(30 * time.Second)
			if _, err := b.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			if l := readList(t, kv); !l.Whole() || !slices.Contains(l.Patterns(), refs[1]) || l.Head.By != "replica-b" {
				t.Fatalf("after the old leader's publish and the new leader's heartbeat: whole %v, by %s, %v (want %s kept)",
					l.Whole(), l.Head.By, l.Patterns(), refs[1])
			}
		})
	}
}

// TestPublishRewritesWhatItDidNotWrite (issue 41): a shard that is not as
// the leader wrote it (overwritten by another writer, deleted by hand, or
// lost by a NATS server that crashed before syncing it) is written again
// at the leader's next heartbeat. Before, the leader trusted its memory of
// what it wrote and never wrote an unchanged shard again.
func TestPublishRewritesWhatItDidNotWrite(t *testing.T) {
	for _, kind := range keepServers {
		t.Run(kind, func(t *testing.T) {
			_, kv := keepStore(t, kind)
			ctx := context.Background()
			clk := clock.NewFake(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
			p, ks := testReplica(kv, "replica-a", clk)
			var want []string
			for i := range 40 {
				ref := fmt.Sprintf("docker.io/library/img%d:1", i)
				declare(ks, "Deployment", fmt.Sprint("w", i), clk.Now(), ref)
				want = append(want, ref)
			}
			slices.Sort(want)
			if err := p.seed(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := p.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			l := readList(t, kv)
			if !l.Whole() || !slices.Equal(l.Patterns(), want) {
				t.Fatalf("published: %v", l.Patterns())
			}
			// Behind its back: one shard emptied, another deleted.
			if _, err := kv.Put(ctx, declared.ShardKey("t", l.Head.Shards, declared.ShardOf(want[0], l.Head.Shards)), []byte(`{"images":[]}`)); err != nil {
				t.Fatal(err)
			}
			if err := kv.Delete(ctx, declared.ShardKey("t", l.Head.Shards, declared.ShardOf(want[1], l.Head.Shards))); err != nil {
				t.Fatal(err)
			}
			clk.Step(30 * time.Second)
			if _, err := p.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			if l := readList(t, kv); !l.Whole() || !slices.Equal(l.Patterns(), want) {
				t.Fatalf("after the heartbeat: whole %v, missing %d, %d of %d images", l.Whole(), l.Missing, len(l.Patterns()), len(want))
			}
		})
	}
}

// TestPublishAfterBucketMadeAgain (issue 41, NATS restarting without its
// store): the bucket deleted and made again (a NATS server whose store
// was lost, then `gcagent ctl keep add`) holds nothing of the list; the
// leader's next heartbeat writes it whole again, head included. Before,
// its compare-and-set on a head that no longer existed failed at every
// try, and the agents, finding no head, held no cluster list at all.
func TestPublishAfterBucketMadeAgain(t *testing.T) {
	for _, kind := range keepServers {
		t.Run(kind, func(t *testing.T) {
			js, kv := keepStore(t, kind)
			ctx := context.Background()
			clk := clock.NewFake(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
			p, ks := testReplica(kv, "replica-a", clk)
			declare(ks, "CronJob", "report", clk.Now(), "docker.io/library/report:7")
			if err := p.seed(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := p.publish(ctx, true); err != nil {
				t.Fatal(err)
			}
			if err := js.DeleteKeyValue(ctx, "gcagent_keep"); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "gcagent_keep", History: 5}); err != nil {
				t.Fatal(err)
			}
			var err error
			for range 3 { // a try may fail: the next one (a second later) must not
				clk.Step(30 * time.Second)
				if _, err = p.publish(ctx, true); err == nil {
					break
				}
			}
			if l := readList(t, kv); err != nil || !l.Whole() || !slices.Equal(l.Patterns(), []string{"docker.io/library/report:7"}) {
				t.Fatalf("after the bucket was made again: %v, list whole %v: %v", err, l.Whole(), l.Patterns())
			}
		})
	}
}

// faultyKV fails the next failUpdates head writes (Update), as a NATS
// that does not answer in time would.
type faultyKV struct {
	jetstream.KeyValue
	failUpdates atomic.Int32
}

func (f *faultyKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if f.failUpdates.Add(-1) >= 0 {
		return 0, errors.New("injected: nats: timeout")
	}
	return f.KeyValue.Update(ctx, key, value, rev)
}

// waitArm waits for the publisher's loop to arm timer i (of the fake
// clock: 0 the heartbeat, 1 the release, 2 the debounce) at at.
func waitArm(t *testing.T, clk *clock.Fake, i int, at time.Time) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case a := <-clk.Arms():
			if a.Timer == i && a.At.Equal(at) {
				return
			}
		case <-deadline:
			t.Fatalf("timer %d never armed at %s", i, at)
		}
	}
}

// TestPublishHeartbeatAfterFailedTry (issue 41, NATS restarting): a
// heartbeat whose write fails is written by the retry a second later.
// Before, the retry wrote only what changed, so the heartbeat was lost
// until the next period, and a NATS away across two heartbeats turned the
// list stale on every agent for a period after it came back.
func TestPublishHeartbeatAfterFailedTry(t *testing.T) {
	_, kv := keepStore(t, "go-module")
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	fkv := &faultyKV{KeyValue: kv}
	p, ks := testReplica(fkv, "replica-a", clk)
	declare(ks, "CronJob", "report", clk.Now(), "docker.io/library/report:7")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	heartbeat := func() time.Time {
		if l := readList(t, kv); l.Head != nil {
			return l.Head.Heartbeat
		}
		return time.Time{}
	}
	testenv.Eventually(t, 10*time.Second, func() string {
		if hb := heartbeat(); !hb.Equal(t0) {
			return fmt.Sprintf("first heartbeat %s", hb)
		}
		return ""
	})
	waitArm(t, clk, 0, t0.Add(30*time.Second))
	fkv.failUpdates.Store(1)
	clk.Step(30 * time.Second) // the heartbeat's write fails
	waitArm(t, clk, 2, t0.Add(31*time.Second))
	clk.Step(time.Second) // the retry
	testenv.Eventually(t, 10*time.Second, func() string {
		if hb := heartbeat(); !hb.Equal(t0.Add(31 * time.Second)) {
			return fmt.Sprintf("heartbeat %s after the retry at %s", hb, t0.Add(31*time.Second))
		}
		return ""
	})
}

// TestPublishGivesUpALeadItCannotUse (issue 41, a leader that never
// releases): a leader whose writes keep failing (its connection to NATS
// broken, its credentials revoked) while it renews its Lease gives the
// lead up once the agents call the list stale (three heartbeats), so that
// the other replica can take over. Before, it retried for ever and held
// the Lease: every agent kept a stale list for as long as it ran.
func TestPublishGivesUpALeadItCannotUse(t *testing.T) {
	_, kv := keepStore(t, "go-module")
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	fkv := &faultyKV{KeyValue: kv}
	p, ks := testReplica(fkv, "replica-a", clk)
	p.cfg.LeaderElection = true
	declare(ks, "CronJob", "report", clk.Now(), "docker.io/library/report:7")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() string {
		if l := readList(t, kv); l.Head == nil || !l.Head.Heartbeat.Equal(t0) {
			return "no first heartbeat yet"
		}
		return ""
	})
	fkv.failUpdates.Store(1 << 30)
	for _, at := range []time.Duration{30 * time.Second, 60 * time.Second} {
		clk.Step(30 * time.Second) // a heartbeat, whose write fails
		waitArm(t, clk, 2, t0.Add(at+time.Second))
		select {
		case err := <-done:
			t.Fatalf("gave up %s after the last heartbeat written: %v", at, err)
		default:
		}
	}
	clk.Step(30 * time.Second) // three periods: the agents call the list stale
	select {
	case err := <-done:
		if err == nil || errors.Is(err, errOtherWriter) {
			t.Fatalf("run returned %v, want a publishing error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader still holds the lead after failing to publish for three heartbeats")
	}
}
