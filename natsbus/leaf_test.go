package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// TestLeafNodeCutAndRestoredExactlyOnce: an agent's publisher on a leaf
// server publishes into the stream of the hub's domain (--nats-js-domain
// hub) while the leaf's link to the hub is cut and restored. The stream
// lives on the hub only; every event is stored there exactly once; the
// node's status goes through the leaf too.
func TestLeafNodeCutAndRestoredExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("leaf node test")
	}
	hub, leaf, link := testenv.StartHubAndLeaf(t)
	nc := connect(t, leaf.ClientURL())
	logs := &logBuffer{}
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{Domain: "hub", AckTimeout: time.Second, Logger: zerolog.New(logs)})
	defer func() {
		if t.Failed() {
			t.Logf("publisher log:\n%s", logs.buf.String())
		}
	}()
	sw, err := NewStatusWriter(nc, StatusOptions{Cluster: "c1", Node: "node-1", Domain: "hub", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := sw.Put(ctx, map[string]any{"seq": 0}); err != nil {
		t.Fatalf("status put through the leaf: %v", err)
	}

	const n, cutAt, restoreAt = 600, 200, 400
	want := make([]string, n)
	hubNC := connect(t, hub.ClientURL())
	for i := range n {
		if i == cutAt {
			wait.Until(t, 20*time.Second, "the first events stored on the hub", func() bool { return streamCount(hubNC) > 0 })
			link.Cut()
			wait.Until(t, 10*time.Second, "the leaf to notice the cut", func() bool { return leaf.NumLeafNodes() == 0 })
			if err := sw.Put(ctx, map[string]any{"seq": 1}); err == nil {
				t.Errorf("status put succeeded with the hub cut off")
			}
		}
		if i == restoreAt {
			wait.Until(t, 10*time.Second, "events waiting in the outbox while cut", func() bool { return p.Depth() > 0 })
			t.Logf("link cut: %d events wait in the outbox, %d stored", p.Depth(), streamCount(hubNC))
			link.Restore()
		}
		if err := p.Publish(action(i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		want[i] = actionID(i)
	}
	wait.Until(t, 30*time.Second, "every event acked by the hub", func() bool { return p.Depth() == 0 })
	assertExactlyOnce(t, hubNC, want)
	wait.For(t, 10*time.Second, func() string {
		if err := sw.Put(ctx, map[string]any{"seq": 2}); err != nil {
			return err.Error()
		}
		return ""
	})

	// The streams live in the hub's domain, not on the leaf.
	leafJS, _ := jetstream.New(connect(t, leaf.ClientURL()))
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, name := range []string{DefaultStream, DefaultStatusStream} {
		if _, err := leafJS.Stream(cctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s on the leaf's own domain: %v, want not found", name, err)
		}
	}
	hubJS, _ := jetstream.New(hubNC)
	st, err := hubJS.Stream(cctx, DefaultStatusStream)
	if err != nil {
		t.Fatalf("status stream on the hub: %v", err)
	}
	m, err := st.GetLastMsgForSubject(cctx, StatusSubject("c1", "node-1"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	if err := json.Unmarshal(m.Data, &got); err != nil || got["seq"] != 2 {
		t.Errorf("last status %s (%v), want seq 2", m.Data, err)
	}
	if info, _ := st.Info(cctx); info == nil || info.State.Msgs != 1 {
		t.Errorf("status stream holds %+v, want one message for the one node", info)
	}
}

// TestInvalidDomain: a domain that is not one subject token is refused.
func TestInvalidDomain(t *testing.T) {
	for _, d := range []string{"a.b", "a b", "*", "x/y"} {
		if err := (PublisherOptions{Node: "n", StateDir: "/tmp", Domain: d}).Validate(); err == nil {
			t.Errorf("domain %q accepted", d)
		}
	}
	if err := (PublisherOptions{Node: "n", StateDir: "/tmp", Domain: "hub"}).Validate(); err != nil {
		t.Error(err)
	}
}
