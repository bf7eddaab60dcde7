package natsbus

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStartEmbedded(t *testing.T) {
	stateDir := t.TempDir()
	s, err := StartEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	u, err := url.Parse(s.ClientURL())
	if err != nil || u.Hostname() != "127.0.0.1" || u.Port() == "" {
		t.Fatalf("client URL %q is not a loopback address with a port", s.ClientURL())
	}

	nc := connect(t, s.ClientURL())
	p := newPublisher(t, nc, stateDir, PublisherOptions{})
	if err := p.Publish(action(1)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the event to be stored", func() bool { return p.Depth() == 0 })
	if p.Mode() != ModeJetStream {
		t.Fatalf("Mode() = %q on the embedded server, want jetstream", p.Mode())
	}
	assertExactlyOnce(t, nc, []string{actionID(1)})
	if _, err := os.Stat(filepath.Join(stateDir, "nats", "jetstream")); err != nil {
		t.Fatalf("JetStream store is not under the state dir: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("JetStream: %v", err)
	}
}

func TestStartEmbeddedErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		opts EmbeddedOptions
		want string
	}{
		{"no state dir", EmbeddedOptions{Listen: "127.0.0.1:-1"}, "state dir"},
		{"bad address", EmbeddedOptions{StateDir: t.TempDir(), Listen: "localhost"}, "listen address"},
		{"bad port", EmbeddedOptions{StateDir: t.TempDir(), Listen: "127.0.0.1:http"}, "bad port"},
		{"address in use", EmbeddedOptions{StateDir: t.TempDir(), Listen: busy.Addr().String()}, "listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			s, err := StartEmbedded(tc.opts)
			if err == nil {
				s.Shutdown()
				t.Fatal("want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("failing took %s", d)
			}
		})
	}
}
