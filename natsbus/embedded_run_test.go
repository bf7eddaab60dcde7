package natsbus

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEmbeddedAuthAndStoreLimit: the embedded server accepts only the state
// dir's nkey (its seed 0600, kept across restarts); an anonymous client or a
// wrong password is refused; JetStream's store is bounded by MaxStore and a
// stream as large as the store is accepted; the agent's connection, in
// process and with its per-node inbox prefix, gets its events stored.
func TestEmbeddedAuthAndStoreLimit(t *testing.T) {
	stateDir := t.TempDir()
	seed, pub, err := EnsureLocalNkey(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(seed)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seed file %s: %v %v, want mode 0600", seed, fi.Mode(), err)
	}
	seed2, pub2, err := EnsureLocalNkey(stateDir)
	if err != nil || seed2 != seed || pub2 != pub {
		t.Fatalf("second EnsureLocalNkey: %s %s %v, want the same key", seed2, pub2, err)
	}
	const maxStore = 8 << 20
	e, err := RunEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1", AuthNkey: pub, MaxStore: maxStore},
		EmbeddedRunOptions{OnUp: func(url string) { _ = WriteLocalURL(stateDir, url) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	addr := e.ClientURL()
	if addr == "" || e.Problem() != "" {
		t.Fatalf("server not running: %q", e.Problem())
	}

	if nc, err := nats.Connect(addr, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected to the embedded server")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("anonymous client: %v, want an authorization error", err)
	}
	if nc, err := nats.Connect(addr, nats.UserInfo("gcagent", "guess"), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a guessed password connected to the embedded server")
	}

	// A local tool finds the URL and credentials in the state dir.
	var url, nkeyFile string
	wait.Until(t, 5*time.Second, "the URL file", func() bool {
		url, nkeyFile, err = LocalClient(stateDir)
		return err == nil && url != ""
	})
	if url != addr || nkeyFile != seed {
		t.Fatalf("LocalClient = %q %q, want %q %q", url, nkeyFile, addr, seed)
	}
	tool, err := Connect(ConnOptions{URL: url, Node: "tool", NkeyFile: nkeyFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tool.Close)
	wait.Until(t, 5*time.Second, "the tool connected with the state dir's nkey", tool.IsConnected)

	agent, err := Connect(ConnOptions{URL: "nats://embedded", Cluster: "c1", Node: "node-1", NkeyFile: seed,
		InProcess: e, InboxPrefix: InboxPrefix("c1", "node-1")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)
	wait.Until(t, 5*time.Second, "the agent connected in process", agent.IsConnected)
	if inbox := agent.NewInbox(); !strings.HasPrefix(inbox, "_INBOX.c1.node-1.") {
		t.Errorf("agent inbox %q, want the per-node prefix", inbox)
	}
	p := newPublisher(t, agent, stateDir, PublisherOptions{StreamMaxBytes: maxStore})
	if err := p.Publish(action(1)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the event stored", func() bool { return p.Depth() == 0 && p.Mode() == ModeJetStream })
	assertExactlyOnce(t, tool, []string{actionID(1)})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, _ := jetstream.New(tool)
	ai, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := e.srv.(*server.Server) // running: ClientURL answered
	if ai.Limits.MaxStore != maxStore && s.JetStreamConfig().MaxStore != maxStore {
		t.Errorf("JetStream max store: account %d, server %d, want %d", ai.Limits.MaxStore, s.JetStreamConfig().MaxStore, maxStore)
	}
	// A stream larger than the store is refused: the bound is real.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "TOO_BIG", Subjects: []string{"big.>"}, MaxBytes: 2 * maxStore})
	if err == nil {
		t.Error("JetStream accepted a stream twice the max store")
	}
}

// TestEmbeddedRetriesWhenPortTaken: with its port taken, RunEmbedded does
// not fail: it reports the problem, counts failures, and the agent's
// in-process connection waits (events stay in the outbox); once the port is
// free the server starts by itself, the connection comes up and the waiting
// event is stored.
func TestEmbeddedRetriesWhenPortTaken(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := busy.Addr().String()
	stateDir := t.TempDir()
	seed, pub, err := EnsureLocalNkey(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	up := make(chan struct{}, 1)
	e, err := RunEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: addr, AuthNkey: pub},
		EmbeddedRunOptions{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Registerer: reg,
			OnUp: func(string) { up <- struct{}{} }})
	if err != nil {
		t.Fatalf("RunEmbedded with its port taken: %v", err)
	}
	t.Cleanup(e.Close)
	if e.ClientURL() != "" || !strings.Contains(e.Problem(), "retrying") {
		t.Fatalf("server %q, problem %q: want not running, retrying", e.ClientURL(), e.Problem())
	}
	agent, err := Connect(ConnOptions{URL: "nats://embedded", Cluster: "c1", Node: "node-1", NkeyFile: seed, InProcess: e,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)
	p := newPublisher(t, agent, t.TempDir(), PublisherOptions{})
	if err := p.Publish(action(1)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 5*time.Second, "two failed attempts", func() bool {
		return testutil.ToFloat64(e.failures) >= 2
	})
	if agent.IsConnected() || p.Depth() != 1 {
		t.Fatalf("connected %v, outbox %d while the server is down", agent.IsConnected(), p.Depth())
	}
	if v := testutil.ToFloat64(e.up); v != 0 {
		t.Errorf("embedded_up %v while down", v)
	}

	busy.Close()
	select {
	case <-up:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not start after the port was freed: %q", e.Problem())
	}
	if e.Problem() != "" || testutil.ToFloat64(e.up) != 1 {
		t.Errorf("problem %q, up %v after start", e.Problem(), testutil.ToFloat64(e.up))
	}
	wait.Until(t, 20*time.Second, "the waiting event stored", func() bool { return p.Depth() == 0 })
	tool := connectNkey(t, e.ClientURL(), seed)
	assertExactlyOnce(t, tool, []string{actionID(1)})
	if _, err := os.Stat(filepath.Join(stateDir, "nats", "jetstream")); err != nil {
		t.Errorf("store not under the state dir: %v", err)
	}
}

func connectNkey(t *testing.T, url, seed string) *nats.Conn {
	t.Helper()
	nc, err := Connect(ConnOptions{URL: url, Node: "tool", NkeyFile: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	wait.Until(t, 5*time.Second, "tool connected", nc.IsConnected)
	return nc
}
