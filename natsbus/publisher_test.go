package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

func newMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPublishExactlyOnce(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	m := newMetrics(t)
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{Metrics: m})

	const n = 300
	var want []string
	for i := range n {
		if err := p.Publish(action(i)); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		want = append(want, actionID(i))
	}
	wait.Until(t, 10*time.Second, "outbox to drain", func() bool { return p.Depth() == 0 })
	if got := p.Mode(); got != ModeJetStream {
		t.Fatalf("Mode() = %q, want %q", got, ModeJetStream)
	}

	// The caller submits the same action again (say, after its own crash): same id, dropped by JetStream.
	if err := p.Publish(action(7)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "duplicate ack", func() bool { return testutil.ToFloat64(m.duplicates) == 1 })
	assertExactlyOnce(t, nc, want)

	if got := testutil.ToFloat64(m.published.WithLabelValues("image")); got != n+1 {
		t.Errorf("published{kind=image} = %v, want %d", got, n+1)
	}
	if got := testutil.ToFloat64(m.acks); got != n+1 {
		t.Errorf("acks = %v, want %d", got, n+1)
	}
	if got := testutil.ToFloat64(m.mode.WithLabelValues(ModeJetStream)); got != 1 {
		t.Errorf("mode{jetstream} = %v, want 1", got)
	}
	wait.Until(t, 5*time.Second, "the depth gauge to reach 0", func() bool { return testutil.ToFloat64(m.depth) == 0 })
}

func TestPublishSurvivesOutage(t *testing.T) {
	port, store := freePort(t), t.TempDir()
	s := runServer(t, port, store, true)
	nc := connect(t, s.ClientURL())
	m := newMetrics(t)
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{Metrics: m})

	var want []string
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := p.Publish(action(i)); err != nil {
				t.Fatalf("Publish %d: %v", i, err)
			}
			want = append(want, actionID(i))
		}
	}
	publish(0, 50)
	wait.Until(t, 10*time.Second, "first batch acked", func() bool { return p.Depth() == 0 })

	publish(50, 100) // some of these are in flight when the server goes away
	s.Shutdown()
	s.WaitForShutdown()
	wait.Until(t, 5*time.Second, "disconnected mode", func() bool { return p.Mode() == ModeDisconnected })

	var slowest time.Duration
	for i := 100; i < 150; i++ {
		start := time.Now()
		publish(i, i+1)
		slowest = max(slowest, time.Since(start))
	}
	if slowest > time.Second {
		t.Errorf("Publish took %s while NATS was down; it must not wait for NATS", slowest)
	}
	t.Logf("slowest Publish while NATS was down: %s", slowest)
	if p.Depth() < 50 {
		t.Fatalf("outbox holds %d events while NATS is down, want at least 50", p.Depth())
	}

	s2 := runServer(t, port, store, true) // same address and store: a restarted server
	wait.Until(t, 15*time.Second, "outbox to drain after the restart", func() bool { return p.Depth() == 0 })
	if got := p.Mode(); got != ModeJetStream {
		t.Fatalf("Mode() = %q, want %q", got, ModeJetStream)
	}
	check := connect(t, s2.ClientURL())
	assertExactlyOnce(t, check, want)
	t.Logf("republishes %v, duplicates %v", testutil.ToFloat64(m.republishes), testutil.ToFloat64(m.duplicates))
}

func TestCrashBetweenSendAndAck(t *testing.T) {
	stateDir := t.TempDir()

	// A first agent run queues events while NATS is unreachable and stops.
	p1 := newPublisher(t, connect(t, deadURL(t)), stateDir, PublisherOptions{CloseTimeout: 50 * time.Millisecond})
	const n = 40
	var want []string
	for i := range n {
		if err := p1.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, actionID(i))
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}

	// It had in fact sent the first half and the server stored them, but it
	// crashed before it saw the acks, so they are still in the outbox.
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	ob, err := openOutbox(filepath.Join(stateDir, OutboxFile), limits{})
	if err != nil {
		t.Fatal(err)
	}
	entries, _, err := ob.peek(n)
	if err != nil || len(entries) != n {
		t.Fatalf("outbox holds %d entries (%v), want %d", len(entries), err, n)
	}
	if err := ob.close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: DefaultStream, Subjects: []string{EventPrefix + ".>"}, Duplicates: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries[:n/2] {
		if _, err := js.PublishMsg(ctx, newMsg(e.Subject, e.Node, e.ID, e.Event)); err != nil {
			t.Fatal(err)
		}
	}

	// The restarted agent sends everything left; JetStream drops the first half as duplicates.
	m := newMetrics(t)
	p2 := newPublisher(t, nc, stateDir, PublisherOptions{Metrics: m})
	wait.Until(t, 10*time.Second, "outbox to drain", func() bool { return p2.Depth() == 0 })
	assertExactlyOnce(t, nc, want)
	if got := testutil.ToFloat64(m.duplicates); got != n/2 {
		t.Errorf("duplicates = %v, want %d", got, n/2)
	}
}

func TestCoreFallback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		jetStream bool
		noCreate  bool
	}{
		{"server without JetStream", false, false},
		{"JetStream without the stream, not allowed to create it", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := ""
			if tc.jetStream {
				store = t.TempDir()
			}
			s := runServer(t, -1, store, tc.jetStream)
			nc := connect(t, s.ClientURL())
			sub, err := nc.SubscribeSync(EventPrefix + ".>")
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			var logs logBuffer
			m := newMetrics(t)
			p := newPublisher(t, nc, t.TempDir(), PublisherOptions{Metrics: m, NoCreateStream: tc.noCreate, Logger: logs.logger()})

			const n = 20
			for i := range n {
				if err := p.Publish(action(i)); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				msg, err := sub.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				var ev CloudEvent
				if err := json.Unmarshal(msg.Data, &ev); err != nil {
					t.Fatal(err)
				}
				if ev.ID != actionID(i) || msg.Header.Get("Nats-Msg-Id") != ev.ID || msg.Header.Get(HeaderNode) != "node-1" {
					t.Fatalf("event %d: id %s, headers %v; want id %s in order", i, ev.ID, msg.Header, actionID(i))
				}
			}
			wait.Until(t, 5*time.Second, "outbox to drain", func() bool { return p.Depth() == 0 })
			if got := p.Mode(); got != ModeCore {
				t.Fatalf("Mode() = %q, want %q", got, ModeCore)
			}
			if got := testutil.ToFloat64(m.mode.WithLabelValues(ModeCore)); got != 1 {
				t.Errorf("mode{core} = %v, want 1", got)
			}
			if got := len(logs.lines(t, "JetStream or the stream is not available on the server: publishing with core NATS (no persistence, no dedupe)")); got != 1 {
				t.Errorf("core fallback logged %d times, want once", got)
			}
		})
	}
}

func TestOutboxBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   func(entrySize int64) PublisherOptions
		first  int           // events published before the clock moves
		step   time.Duration // clock step before the rest
		total  int
		remain int // newest events left
	}{
		{"max entries", func(int64) PublisherOptions { return PublisherOptions{MaxEntries: 5} }, 12, 0, 12, 5},
		{"max bytes", func(n int64) PublisherOptions { return PublisherOptions{MaxBytes: 3*n + n/2} }, 10, 0, 10, 3},
		{"max age", func(int64) PublisherOptions { return PublisherOptions{MaxAge: time.Minute} }, 7, 2 * time.Minute, 9, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			m := newMetrics(t)
			stateDir := t.TempDir()
			opts := tc.opts(storedSize(t, action(5)))
			opts.Metrics, opts.Logger, opts.Now, opts.CloseTimeout = m, logs.logger(), clock.Now, 50*time.Millisecond
			p := newPublisher(t, connect(t, deadURL(t)), stateDir, opts)
			for i := range tc.total {
				if i == tc.first {
					clock.Add(tc.step)
				}
				if err := p.Publish(action(i)); err != nil {
					t.Fatalf("Publish %d: %v", i, err)
				}
			}
			dropped := tc.total - tc.remain
			if got := p.Depth(); got != tc.remain {
				t.Errorf("Depth() = %d, want %d", got, tc.remain)
			}
			if got := testutil.ToFloat64(m.dropped); got != float64(dropped) {
				t.Errorf("dropped metric = %v, want %d", got, dropped)
			}
			lines := logs.lines(t, "outbox over its bound: dropped the oldest events unsent")
			sum := 0
			for _, l := range lines {
				if l["level"] != "error" {
					t.Errorf("drop logged at level %v, want error", l["level"])
				}
				sum += int(l["dropped"].(float64))
			}
			if sum != dropped || len(lines) == 0 || lines[0]["oldest_id"] != actionID(0) {
				t.Errorf("drop log lines %v: want %d dropped in all, oldest first %s", lines, dropped, actionID(0))
			}

			start := time.Now()
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Close took %s with NATS down", d)
			}
			ob, err := openOutbox(filepath.Join(stateDir, OutboxFile), limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.close()
			entries, _, _ := ob.peek(100)
			for i, e := range entries {
				if want := actionID(tc.total - tc.remain + i); e.ID != want {
					t.Errorf("entry %d is %s, want %s (the newest are kept, in order)", i, e.ID, want)
				}
			}
		})
	}
}

func TestPublishTooLarge(t *testing.T) {
	p := newPublisher(t, connect(t, deadURL(t)), t.TempDir(), PublisherOptions{MaxBytes: 1024, CloseTimeout: 50 * time.Millisecond})
	a := action(0)
	a.Data = string(make([]byte, 2048))
	if err := p.Publish(a); err == nil {
		t.Fatal("an event larger than the outbox must be refused")
	}
	if p.Depth() != 0 {
		t.Fatalf("Depth() = %d, want 0", p.Depth())
	}
}

func TestCloseFlushes(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{})
	var want []string
	for i := range 50 {
		if err := p.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, actionID(i))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(action(99)); err != ErrClosed {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	assertExactlyOnce(t, nc, want)
}

func TestPublisherOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts PublisherOptions
		ok   bool
	}{
		{"defaults", PublisherOptions{Node: "n", StateDir: "/x"}, true},
		{"no node", PublisherOptions{StateDir: "/x"}, false},
		{"no state dir", PublisherOptions{Node: "n"}, false},
		{"control char in node", PublisherOptions{Node: "n\n", StateDir: "/x"}, false},
		{"bad stream name", PublisherOptions{Node: "n", StateDir: "/x", Stream: "a.b"}, false},
		{"negative bound", PublisherOptions{Node: "n", StateDir: "/x", MaxEntries: -1}, false},
		{"window shorter than max age", PublisherOptions{Node: "n", StateDir: "/x", MaxAge: 2 * time.Hour, DuplicateWindow: time.Hour}, false},
		{"long max age widens the default window", PublisherOptions{Node: "n", StateDir: "/x", MaxAge: 48 * time.Hour}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.opts.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// storedSize returns how many outbox bytes the event of a takes.
func storedSize(t *testing.T, a Action) int64 {
	t.Helper()
	ev, err := NewEvent("c1", "node-1", a, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(ev)
	v, err := encodeEntry(entry{ID: ev.ID, Kind: a.Kind, Node: "node-1", Event: payload,
		Subject: Subject("c1", "node-1", a.Kind, a.Action)})
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(v))
}

func TestLostAcksAreRetriedWithSameID(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	proxy := startProxy(t, s.Addr().String())
	direct := connect(t, s.ClientURL())
	m := newMetrics(t)
	p := newPublisher(t, connect(t, proxy.url()), t.TempDir(), PublisherOptions{Metrics: m, AckTimeout: 200 * time.Millisecond})
	if err := p.Publish(action(0)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "first event acked", func() bool { return p.Depth() == 0 })

	// The server stores what the agent sends, but no ack comes back.
	proxy.dropAcks.Store(true)
	const n = 30
	want := []string{actionID(0)}
	for i := 1; i <= n; i++ {
		if err := p.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, actionID(i))
	}
	wait.Until(t, 10*time.Second, "the server to store every event", func() bool { return streamCount(direct) == n+1 })
	wait.Until(t, 10*time.Second, "a retry after an ack timeout", func() bool { return testutil.ToFloat64(m.republishes) > 0 })
	if got := p.Depth(); got != n {
		t.Fatalf("Depth() = %d while no ack came back, want %d", got, n)
	}

	// The connection breaks and comes back: the agent resends, JetStream drops the duplicates.
	proxy.cut()
	proxy.dropAcks.Store(false)
	wait.Until(t, 10*time.Second, "outbox to drain", func() bool { return p.Depth() == 0 })
	assertExactlyOnce(t, direct, want)
	if got := testutil.ToFloat64(m.duplicates); got < n {
		t.Errorf("duplicates = %v, want at least %d", got, n)
	}
}

func TestSenderExpiresOldEvents(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := newMetrics(t)
	p := newPublisher(t, connect(t, deadURL(t)), t.TempDir(), PublisherOptions{
		MaxAge: time.Minute, Now: clock.Now, Metrics: m, CloseTimeout: 50 * time.Millisecond,
	})
	for i := range 3 {
		if err := p.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Add(2 * time.Minute)
	wait.Until(t, 10*time.Second, "the sender to drop and count the expired events", func() bool {
		return p.Depth() == 0 && testutil.ToFloat64(m.dropped) == 3
	})
}

func TestPublisherStartsBeforeServer(t *testing.T) {
	port := freePort(t)
	nc := connect(t, "nats://127.0.0.1:"+strconv.Itoa(port))
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{})
	var want []string
	for i := range 5 {
		if err := p.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, actionID(i))
	}
	if got := p.Mode(); got != ModeDisconnected {
		t.Fatalf("Mode() = %q before any server, want %q", got, ModeDisconnected)
	}
	runServer(t, port, t.TempDir(), true)
	wait.Until(t, 10*time.Second, "outbox to drain once the server is up", func() bool { return p.Depth() == 0 })
	assertExactlyOnce(t, nc, want)
}

func TestCorruptOutboxEntryIsDroppedAndDeliveryGoesOn(t *testing.T) {
	stateDir := t.TempDir()
	p1 := newPublisher(t, connect(t, deadURL(t)), stateDir, PublisherOptions{CloseTimeout: 50 * time.Millisecond})
	const n = 5
	var want []string
	for i := range n {
		if err := p1.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		if i != 2 {
			want = append(want, actionID(i))
		}
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}

	// Garbage at the head, and an entry that decodes to nothing in the middle.
	db, err := bolt.Open(filepath.Join(stateDir, OutboxFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		var third []byte
		c := b.Cursor()
		k, _ := c.First()
		for range 2 {
			k, _ = c.Next()
		}
		third = slices.Clone(k)
		return errors.Join(b.Put(seqKey(0), []byte("not an outbox entry")), b.Put(third, []byte("\x00\x00\x00\x00\x00\x00\x00\x01{}")))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	var logs logBuffer
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	m := newMetrics(t)
	p2 := newPublisher(t, nc, stateDir, PublisherOptions{Metrics: m, Logger: logs.logger()})
	wait.Until(t, 10*time.Second, "outbox to drain past the corrupt entries", func() bool { return p2.Depth() == 0 })
	assertExactlyOnce(t, nc, want)
	if got := testutil.ToFloat64(m.dropped); got != 2 {
		t.Errorf("dropped metric = %v, want 2", got)
	}
	lines := logs.lines(t, "outbox entry cannot be decoded: dropped it unsent")
	if len(lines) != 1 || lines[0]["level"] != "error" || lines[0]["dropped"] != 2.0 || lines[0]["oldest_id"] != "seq 0" {
		t.Errorf("log lines %v, want one error line: 2 dropped, oldest seq 0", lines)
	}
}
