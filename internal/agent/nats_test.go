package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// TestEmbeddedStoreHoldsEveryStream starts the embedded server as the
// agent configures it and makes the three things it must hold: the event
// stream (through a real publisher), the node status stream (through the
// status writer) and the fleet keep list bucket. JetStream refuses a
// stream its store cannot reserve, so a share-out that does not add up
// fails here, also after an upgrade from an agent that gave the events
// the whole store: at 7485972 the status stream was refused with "insufficient
// storage resources available" and `gcagent watch` saw no node.
func TestEmbeddedStoreHoldsEveryStream(t *testing.T) {
	for _, store := range []int64{minEmbeddedNATSMaxStore, DefaultEmbeddedNATSMaxStore, 4 << 30} {
		t.Run(fmt.Sprint(store>>10, "KiB"), func(t *testing.T) {
			c := DefaultConfig()
			c.StateDir, c.NodeName, c.EmbeddedNATSListen, c.EmbeddedNATSMaxStore = t.TempDir(), "node-1", "127.0.0.1:0", store
			s, err := natsbus.StartEmbedded(c.EmbeddedOptions())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
			nc, err := nats.Connect(s.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			events, status := embeddedShares(store)
			if sum := events + status + natsbus.EmbeddedKeepMaxBytes; sum != store || events <= 0 {
				t.Fatalf("shares of %d: events %d + status %d + keep %d = %d", store, events, status, natsbus.EmbeddedKeepMaxBytes, sum)
			}

			// An upgrade: the agent before this share-out made the event
			// stream as large as the store less the keep bucket.
			old := c.PublisherOptions()
			old.StateDir, old.StreamMaxBytes = t.TempDir(), store-natsbus.EmbeddedKeepMaxBytes
			oldPub, err := natsbus.NewPublisher(nc, old)
			if err != nil {
				t.Fatal(err)
			}
			if err := oldPub.Publish(natsbus.Action{Kind: schema.KindAgent, Action: "started", Subject: "node-1", Key: "0"}); err != nil {
				t.Fatal(err)
			}
			_ = oldPub.Close()

			po := c.PublisherOptions()
			po.StateDir = t.TempDir()
			pub, err := natsbus.NewPublisher(nc, po)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			if err := pub.Publish(natsbus.Action{Kind: schema.KindAgent, Action: "heartbeat", Subject: "node-1", Key: "1"}); err != nil {
				t.Fatal(err)
			}
			js, err := natsbus.NewJetStream(nc, "")
			if err != nil {
				t.Fatal(err)
			}
			for {
				if st, err := js.Stream(ctx, po.Stream); err == nil && st.CachedInfo().State.Msgs == 2 {
					if got := st.CachedInfo().Config.MaxBytes; got != events {
						t.Fatalf("event stream MaxBytes %d, want %d", got, events)
					}
					break
				}
				select {
				case <-ctx.Done():
					t.Fatal("the event was never stored")
				case <-time.After(20 * time.Millisecond):
				}
			}

			sw, err := natsbus.NewStatusWriter(nc, c.StatusOptions(zerolog.Nop()))
			if err != nil {
				t.Fatal(err)
			}
			if err := sw.Put(ctx, map[string]string{"node": "node-1"}); err != nil {
				t.Fatalf("status put: %v", err)
			}
			if _, err := natsbus.EnsureKeepBucket(ctx, js, 1, natsbus.EmbeddedKeepMaxBytes); err != nil {
				t.Fatalf("keep bucket: %v", err)
			}
		})
	}
}
