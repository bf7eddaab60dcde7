package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/natsbus"
)

// TestEmbeddedStreamsFitTheStore: on the embedded server, the events
// stream, the status stream and the keep bucket each reserve their bytes
// of the store, and all three are created whichever comes first (the
// status writer and the publisher race when the server starts late).
func TestEmbeddedStreamsFitTheStore(t *testing.T) {
	for _, store := range []int64{DefaultEmbeddedNATSMaxStore, minEmbeddedNATSMaxStore} {
		c := DefaultConfig()
		c.EmbeddedNATSMaxStore = store
		po, so := c.PublisherOptions(), c.StatusOptions(zerolog.Nop())
		events := jetstream.StreamConfig{Name: "GCAGENT_EVT", Subjects: []string{natsbus.EventPrefix + ".>"},
			Storage: jetstream.FileStorage, MaxBytes: po.StreamMaxBytes}
		status := natsbus.StatusStreamConfig("GCAGENT_STATUS", 1, time.Hour, so.MaxBytes)
		create := map[string]func(context.Context, jetstream.JetStream) error{
			"events": func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, events)
				return err
			},
			"status": func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, status)
				return err
			},
			"keep": func(ctx context.Context, js jetstream.JetStream) error {
				_, err := natsbus.EnsureKeepBucket(ctx, js, 1, natsbus.EmbeddedKeepMaxBytes)
				return err
			},
		}
		for _, order := range [][]string{{"status", "events", "keep"}, {"keep", "status", "events"}, {"events", "status", "keep"}} {
			t.Run(fmt.Sprintf("%d/%v", store, order), func(t *testing.T) {
				s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
					JetStreamMaxStore: store, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
				if err != nil {
					t.Fatal(err)
				}
				go s.Start()
				defer s.Shutdown()
				if !s.ReadyForConnections(10 * time.Second) {
					t.Fatal("nats server not ready")
				}
				nc, err := nats.Connect(s.ClientURL())
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for _, what := range order {
					if err := create[what](ctx, js); err != nil {
						t.Errorf("%s after %v: %v", what, order, err)
					}
				}
			})
		}
	}
}
