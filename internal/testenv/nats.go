package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOptions configures an embedded NATS server.
type NATSOptions struct {
	JetStream bool
	Port      int    // 0 picks a free port
	StoreDir  string // default a temp dir of the test
}

// StartNATS starts an embedded NATS server on loopback and stops it when the
// test ends.
func StartNATS(t testing.TB, o NATSOptions) *server.Server {
	t.Helper()
	if o.Port == 0 {
		o.Port = server.RANDOM_PORT
	}
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: o.Port, JetStream: o.JetStream, StoreDir: o.StoreDir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
