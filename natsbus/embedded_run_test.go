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
		EmbeddedRunOptions{OnListen: func(url string) { _ = WriteLocalURL(stateDir, url) }})
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

// TestEmbeddedRunsWhenPortTaken: with its client address taken the
// embedded server still runs in process: the agent's in-process
// connection comes up at once and its event is stored while the address
// is taken; Problem names the address and the bind error, and the
// listener is retried (counted, gauge 0). Once the address is free the
// listener binds by itself, local tools connect through it with the
// state dir's nkey and see the event, and an anonymous client is
// refused. On d7dd547 the server did not start at all while its port was
// taken: the connection stayed down and the event waited in the outbox.
func TestEmbeddedRunsWhenPortTaken(t *testing.T) {
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
	listening := make(chan string, 1)
	e, err := RunEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: addr, AuthNkey: pub},
		EmbeddedRunOptions{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Registerer: reg,
			OnListen: func(url string) { listening <- url }})
	if err != nil {
		t.Fatalf("RunEmbedded with its port taken: %v", err)
	}
	t.Cleanup(e.Close)
	if !e.Running() || e.ClientURL() != "" {
		t.Fatalf("running %v, client URL %q: want running in process, not listening", e.Running(), e.ClientURL())
	}
	if p := e.Problem(); !strings.Contains(p, "cannot listen on "+addr) || !strings.Contains(p, "address already in use") || !strings.Contains(p, "retrying") {
		t.Errorf("problem %q: want the address, the bind error and that it retries", p)
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
	wait.Until(t, 20*time.Second, "the event stored while the port is taken", func() bool { return p.Depth() == 0 })
	wait.Until(t, 5*time.Second, "two failed binds", func() bool { return testutil.ToFloat64(e.listenFailures) >= 2 })
	if v := testutil.ToFloat64(e.up); v != 1 {
		t.Errorf("embedded_up %v while the server runs in process", v)
	}
	if v := testutil.ToFloat64(e.listening); v != 0 {
		t.Errorf("embedded_listening %v while the port is taken", v)
	}
	if v := testutil.ToFloat64(e.failures); v != 0 {
		t.Errorf("%v server start failures: only the listener failed", v)
	}

	busy.Close()
	var url string
	select {
	case url = <-listening:
	case <-time.After(30 * time.Second):
		t.Fatalf("the listener did not bind after the port was freed: %q", e.Problem())
	}
	if url != "nats://"+addr || e.ClientURL() != url || e.Problem() != "" || testutil.ToFloat64(e.listening) != 1 {
		t.Errorf("url %q, client URL %q, problem %q, listening %v after the bind", url, e.ClientURL(), e.Problem(), testutil.ToFloat64(e.listening))
	}
	tool := connectNkey(t, url, seed)
	assertExactlyOnce(t, tool, []string{actionID(1)})
	if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected through the listener")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("anonymous client: %v, want an authorization error", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "nats", "jetstream")); err != nil {
		t.Errorf("store not under the state dir: %v", err)
	}
	// Close ends the connections the listener handed to the server.
	e.Close()
	wait.Until(t, 10*time.Second, "the tool disconnected by Close", func() bool { return !tool.IsConnected() })
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

// TestEmbeddedKeepStored: the embedded store holds the keep list bucket
// exactly when the server made it: not before the server ever ran, not
// after it ran without the bucket, and not after the bucket was removed.
func TestEmbeddedKeepStored(t *testing.T) {
	stateDir := t.TempDir()
	stored := func() bool {
		t.Helper()
		ok, err := EmbeddedKeepStored(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if stored() {
		t.Fatal("no store, but a bucket")
	}
	_, pub, err := EnsureLocalNkey(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(stateDir, LocalNkeyFile)
	e, err := RunEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1", AuthNkey: pub}, EmbeddedRunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	nc, err := Connect(ConnOptions{URL: "nats://embedded", Node: "n1", NkeyFile: seed, InProcess: e})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	wait.Until(t, 10*time.Second, "connected in process", nc.IsConnected)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	if _, err := js.AccountInfo(ctx); err != nil || stored() {
		t.Fatalf("a store without the bucket: %v, stored %v", err, stored())
	}
	if _, err := EnsureKeepBucket(ctx, js, 1, EmbeddedKeepMaxBytes); err != nil {
		t.Fatal(err)
	}
	if !stored() {
		t.Fatal("the bucket is not found in the store")
	}
	if err := js.DeleteKeyValue(ctx, KeepBucket); err != nil {
		t.Fatal(err)
	}
	if stored() {
		t.Fatal("the removed bucket is still found")
	}
}
