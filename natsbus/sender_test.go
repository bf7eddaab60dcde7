package natsbus

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestAckLostMidBatchKeepsOrder loses the JetStream ack of one event in the
// middle of a batch (the server stored it; the acks of the events after it
// arrive): the events after it must stay in the outbox until it is acked, and
// the stream must hold every event once, in the order they were published.
func TestAckLostMidBatchKeepsOrder(t *testing.T) {
	// Queue the batch while NATS is unreachable, so that the first round sends it whole.
	stateDir := t.TempDir()
	p1 := newPublisher(t, connect(t, deadURL(t)), stateDir, PublisherOptions{CloseTimeout: 50 * time.Millisecond})
	const n, lost = 10, 3
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

	s := runServer(t, -1, t.TempDir(), true)
	proxy := startProxy(t, s.Addr().String())
	proxy.dropAckSeq.Store(lost + 1) // the stream is new: event i is stored at sequence i+1
	direct := connect(t, s.ClientURL())
	m := newMetrics(t)
	p := newPublisher(t, connect(t, proxy.url()), stateDir, PublisherOptions{Metrics: m, AckTimeout: time.Second})
	wait.Until(t, 10*time.Second, "the server to store every event", func() bool { return streamCount(direct) == n })
	wait.Until(t, 10*time.Second, "a retry after the lost ack", func() bool { return testutil.ToFloat64(m.republishes) > 0 })

	left, _, err := p.ob.peek(n)
	if err != nil {
		t.Fatal(err)
	}
	var leftIDs []string
	for _, e := range left {
		leftIDs = append(leftIDs, e.ID)
	}
	if !slices.Equal(leftIDs, want[lost:]) {
		t.Errorf("outbox holds %d events while event %d is unacked: %v, want events %d..%d (nothing after it removed before it)",
			len(leftIDs), lost, leftIDs, lost, n-1)
	}

	// The ack gets through again: the retry from the unacked event drains the outbox.
	proxy.dropAckSeq.Store(0)
	wait.Until(t, 10*time.Second, "outbox to drain", func() bool { return p.Depth() == 0 })
	assertExactlyOnce(t, direct, want)
	var stored []string
	for _, msg := range streamMsgs(t, direct) {
		var ev CloudEvent
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, ev.ID)
	}
	if !slices.Equal(stored, want) {
		t.Errorf("stream order %v, want %v", stored, want)
	}
	if got := testutil.ToFloat64(m.published.WithLabelValues("image")); got != n {
		t.Errorf("published{kind=image} = %v, want %d (each event counted once, when it leaves the outbox)", got, n)
	}
}

// TestStreamRefusesEventMidBatch: a stream managed elsewhere refuses one
// event of a batch for good (over its max message size); that event is
// dropped, logged and counted, and the events after it are delivered in
// order instead of waiting behind it until it expires.
func TestStreamRefusesEventMidBatch(t *testing.T) {
	stateDir := t.TempDir()
	p1 := newPublisher(t, connect(t, deadURL(t)), stateDir, PublisherOptions{CloseTimeout: 50 * time.Millisecond})
	const n, big = 5, 2
	var want []string
	for i := range n {
		a := action(i)
		if i == big {
			a.Data = map[string]any{"bytes": i, "pad": strings.Repeat("x", 4096)}
		} else {
			want = append(want, actionID(i))
		}
		if err := p1.Publish(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}

	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: DefaultStream, Subjects: []string{EventPrefix + ".>"}, Duplicates: DefaultDuplicateWindow, MaxMsgSize: 2048,
	}); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	m := newMetrics(t)
	p := newPublisher(t, nc, stateDir, PublisherOptions{Metrics: m, NoCreateStream: true, Logger: logs.logger()})
	wait.Until(t, 10*time.Second, "outbox to drain past the refused event", func() bool { return p.Depth() == 0 })
	assertExactlyOnce(t, nc, want)
	var stored []string
	for _, msg := range streamMsgs(t, nc) {
		var ev CloudEvent
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, ev.ID)
	}
	if !slices.Equal(stored, want) {
		t.Errorf("stream order %v, want %v", stored, want)
	}
	if got := testutil.ToFloat64(m.dropped); got != 1 {
		t.Errorf("dropped = %v, want 1", got)
	}
	lines := logs.lines(t, "NATS refuses this event: dropped it from the outbox")
	if len(lines) != 1 || lines[0]["event_id"] != actionID(big) {
		t.Errorf("log lines %v, want one naming event %s", lines, actionID(big))
	}
}
