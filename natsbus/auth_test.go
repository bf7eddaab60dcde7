package natsbus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// authConfig is a per-node permission model after Choria's: account FLEET
// holds the nodes, each an nkey user that may publish only its own events
// (plus the JetStream API calls its Publisher makes), subscribe only to its
// own and the cluster-wide control subjects and to its own inboxes (the
// per-node prefix _INBOX.<cluster>.<node>, see InboxPrefix), and reply to
// requests it received (allow_responses). Operators live in account OPS,
// which imports the fleet's control subjects as a service with share, so
// the server stamps each request with the operator's identity
// (Nats-Request-Info). A FLEET reader may read the stream.
const authConfig = `
listen: "127.0.0.1:-1"
server_name: auth
jetstream { store_dir: %q }
accounts {
  FLEET {
    jetstream: enabled
    users: [
      %s
      { user: reader, password: r3ader, permissions: { publish: ["$JS.API.>"], subscribe: ["_INBOX.>"] } }
    ]
    exports: [ { service: "gcagent.v1.ctl.>", response_type: stream } ]
  }
  OPS {
    users: [ { user: ops, password: s3cret } ]
    imports: [ { service: { account: FLEET, subject: "gcagent.v1.ctl.>" }, share: true } ]
  }
}
`

// nodeUser is the permission block of node in cluster c1.
func nodeUser(pub, node string) string {
	return fmt.Sprintf(`{ nkey: %s, permissions: {
        publish: { allow: ["gcagent.v1.evt.c1.%[2]s.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.GCAGENT_EVT", "$JS.API.STREAM.CREATE.GCAGENT_EVT",
          "gcagent.v1.status.c1.%[2]s", "$JS.API.STREAM.INFO.GCAGENT_STATUS", "$JS.API.STREAM.CREATE.GCAGENT_STATUS"] }
        subscribe: { allow: ["gcagent.v1.ctl.c1.%[2]s.>", "gcagent.v1.ctl.c1.all.>", "_INBOX.c1.%[2]s.>"] }
        allow_responses: { max: 1, expires: "1m" }
      } }`, pub, node)
}

// newNodeKey writes a fresh user nkey seed to a file and returns its path and public key.
func newNodeKey(t *testing.T) (seedFile, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ = kp.PublicKey()
	seedFile = filepath.Join(t.TempDir(), "node.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return seedFile, pub
}

func startAuthServer(t *testing.T, users ...string) *server.Server {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(authConfig, t.TempDir(), strings.Join(users, "\n      "))), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("server config: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// TestAuthPerNodePermissions: with Choria-style per-node credentials, a
// node publishes its events and answers its own and cluster-wide control
// requests; the server refuses the node's attempts to request another
// node's control subject, to subscribe to it, or to publish events as
// another node; gc stays refused without AllowRemoteGC; the request's
// caller identity comes from the server.
func TestAuthPerNodePermissions(t *testing.T) {
	seed1, pub1 := newNodeKey(t)
	_, pub2 := newNodeKey(t)
	s := startAuthServer(t, nodeUser(pub1, "n1"), nodeUser(pub2, "n2"))

	nodeLog := &logBuffer{}
	n1, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "n1", NkeyFile: seed1, Logger: nodeLog.logger(),
		InboxPrefix: InboxPrefix("c1", "n1"), ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n1.Close)
	wait.Until(t, 5*time.Second, "n1 connected", n1.IsConnected)
	ops, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "operator", User: "ops", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ops.Close)
	reader, err := nats.Connect(s.ClientURL(), nats.UserInfo("reader", "r3ader"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	// A wrong nkey does not get in.
	if _, err := nats.Connect(s.ClientURL(), nats.UserInfo("n1", "guess")); err == nil {
		t.Error("connected with a guessed password")
	}

	// n1 publishes its own events into the stream.
	p, err := NewPublisher(n1, PublisherOptions{Cluster: "c1", Node: "n1", StateDir: t.TempDir(), AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	for i := range 5 {
		if err := p.Publish(Action{Kind: "image", Action: "removed", Subject: "sha256:x", Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	wait.Until(t, 10*time.Second, "n1's events stored", func() bool { return p.Depth() == 0 && streamCount(reader) == 5 })
	if p.Mode() != ModeJetStream {
		t.Errorf("publisher mode %s with least-privilege JetStream permissions", p.Mode())
	}

	// n1 answers control requests from an operator in another account.
	ctlLog := &logBuffer{}
	h := newFakeHandler("n1")
	serveControl(t, n1, h, ControlOptions{Cluster: "c1", Node: "n1", Logger: ctlLog.logger()})
	r, err := Request(ctx5(t), ops, "c1", "n1", VerbStatus, RequestOptions{ID: "ops-1"})
	if err != nil || !r.OK || r.Node != "n1" {
		t.Fatalf("operator's status to n1: %+v %v", r, err)
	}
	all, err := RequestAll(ctx5(t), ops, "c1", VerbStatus, 1, RequestOptions{ID: "ops-all"})
	if err != nil || len(all) != 1 || !all[0].OK {
		t.Fatalf("operator's status to all: %+v %v", all, err)
	}
	r, err = Request(ctx5(t), ops, "c1", "n1", VerbGC, RequestOptions{ID: "ops-gc"})
	if err != nil || r.OK || r.Error != ErrRemoteGCDisabled.Error() || h.count(VerbGC) != 0 {
		t.Fatalf("gc without AllowRemoteGC: %+v %v", r, err)
	}
	// The server, not the caller, says who asked.
	lines := ctlLog.lines(t, "control request")
	if len(lines) != 3 {
		t.Fatalf("%d control log lines", len(lines))
	}
	for _, l := range lines {
		if l["caller_account"] != "OPS" || l["caller_user"] != "ops" || l["caller_name"] != "gcagent/c1/operator" || l["caller"] != "gcagent/c1/operator" {
			t.Errorf("caller identity in %v", l)
		}
	}

	violation := func(what string) {
		t.Helper()
		wait.Until(t, 5*time.Second, "a permissions violation: "+what, func() bool {
			for _, l := range nodeLog.lines(t, "NATS error") {
				if e, _ := l["error"].(string); strings.Contains(strings.ToLower(e), strings.ToLower(what)) {
					return true
				}
			}
			return false
		})
	}
	// n1 may not send a request to n2's control subject (nor its own).
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = Request(short, n1, "c1", "n2", VerbGC, RequestOptions{ID: "n1-to-n2"})
	if err == nil {
		t.Fatal("n1's request to n2 got a reply")
	}
	violation(`Permissions Violation for Publish to "gcagent.v1.ctl.c1.n2.gc"`)

	// n1 may not listen on n2's control subject: serving as n2 with n1's
	// credentials gets nothing, so an operator's request finds no responder.
	impostor := newFakeHandler("n2")
	go func() { _ = ServeControl(t.Context(), n1, impostor, ControlOptions{Cluster: "c1", Node: "n2"}) }()
	violation(`Permissions Violation for Subscription to "gcagent.v1.ctl.c1.n2.>"`)
	_, err = Request(ctx5(t), ops, "c1", "n2", VerbStatus, RequestOptions{})
	if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("request to n2 answered through n1's credentials: %v", err)
	}
	if impostor.count(VerbStatus) != 0 {
		t.Error("n1 received n2's control request")
	}

	// n1 may not publish events as n2.
	fake, err := NewPublisher(n1, PublisherOptions{Cluster: "c1", Node: "n2", StateDir: t.TempDir(), AckTimeout: 500 * time.Millisecond, CloseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	if err := fake.Publish(Action{Kind: "image", Action: "removed", Subject: "sha256:y", Key: "forged"}); err != nil {
		t.Fatal(err)
	}
	violation(`Permissions Violation for Publish to "gcagent.v1.evt.c1.n2.image.removed"`)
	if n := streamCount(reader); n != 5 || fake.Depth() != 1 {
		t.Errorf("after a forged publish: stream %d messages, outbox %d", n, fake.Depth())
	}
	js, _ := jetstream.New(reader)
	st, err := js.Stream(ctx5(t), DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx5(t), jetstream.WithSubjectFilter("gcagent.v1.evt.c1.n2.>"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 0 {
		t.Errorf("n2's subjects hold events: %v", info.State.Subjects)
	}
}

// TestAuthPerNodeInbox: with the per-node inbox prefix in the tested
// authorization config, each node gets its JetStream acks and control
// replies on _INBOX.c1.<node>; n1 cannot subscribe to n2's replies (the
// server refuses it and n1 receives nothing while n2's events are acked),
// and a node still using the shared _INBOX prefix gets no acks at all.
func TestAuthPerNodeInbox(t *testing.T) {
	seed1, pub1 := newNodeKey(t)
	seed2, pub2 := newNodeKey(t)
	s := startAuthServer(t, nodeUser(pub1, "n1"), nodeUser(pub2, "n2"))
	reader, err := nats.Connect(s.ClientURL(), nats.UserInfo("reader", "r3ader"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	nodeConn := func(seed, node, prefix string, log *logBuffer) *nats.Conn {
		t.Helper()
		nc, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: node, NkeyFile: seed, InboxPrefix: prefix,
			Logger: log.logger(), ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		wait.Until(t, 5*time.Second, node+" connected", nc.IsConnected)
		return nc
	}
	log1, log2 := &logBuffer{}, &logBuffer{}
	n1 := nodeConn(seed1, "n1", InboxPrefix("c1", "n1"), log1)
	n2 := nodeConn(seed2, "n2", InboxPrefix("c1", "n2"), log2)

	// n1 tries to read n2's replies.
	spy, err := n1.SubscribeSync(InboxPrefix("c1", "n2") + ".>")
	if err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 5*time.Second, "the server to refuse n1's subscription to n2's inbox", func() bool {
		for _, l := range log1.lines(t, "NATS error") {
			if e, _ := l["error"].(string); strings.Contains(e, `Permissions Violation for Subscription to "_INBOX.c1.n2.>"`) {
				return true
			}
		}
		return false
	})

	// n2 publishes with JetStream acks on its own inbox, and answers a control request from n1's side of the fleet (the operator).
	p2, err := NewPublisher(n2, PublisherOptions{Cluster: "c1", Node: "n2", StateDir: t.TempDir(), AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p2.Close() })
	for i := range 3 {
		if err := p2.Publish(Action{Kind: "image", Action: "removed", Subject: "sha256:n2", Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	wait.Until(t, 10*time.Second, "n2's events acked", func() bool { return p2.Depth() == 0 && streamCount(reader) == 3 })
	ops, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "operator", User: "ops", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ops.Close)
	serveControl(t, n2, newFakeHandler("n2"), ControlOptions{Cluster: "c1", Node: "n2"})
	if r, err := Request(ctx5(t), ops, "c1", "n2", VerbStatus, RequestOptions{ID: "ops-n2"}); err != nil || !r.OK {
		t.Fatalf("operator's status to n2: %+v %v", r, err)
	}
	if m, err := spy.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("n1 read n2's reply on %s", m.Subject)
	}

	// n1 with its own prefix gets its acks; the same node with the shared prefix gets none.
	p1, err := NewPublisher(n1, PublisherOptions{Cluster: "c1", Node: "n1", StateDir: t.TempDir(), AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p1.Close() })
	if err := p1.Publish(Action{Kind: "image", Action: "removed", Subject: "sha256:n1", Key: "1"}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "n1's event acked", func() bool { return p1.Depth() == 0 && streamCount(reader) == 4 })
	sharedLog := &logBuffer{}
	shared := nodeConn(seed1, "n1", "", sharedLog)
	ps, err := NewPublisher(shared, PublisherOptions{Cluster: "c1", Node: "n1", StateDir: t.TempDir(), AckTimeout: 300 * time.Millisecond, CloseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Close() })
	if err := ps.Publish(Action{Kind: "image", Action: "removed", Subject: "sha256:n1", Key: "2"}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the server to refuse the shared _INBOX prefix", func() bool {
		for _, l := range sharedLog.lines(t, "NATS error") {
			if e, _ := l["error"].(string); strings.Contains(e, `Permissions Violation for Subscription to "_INBOX.`) {
				return true
			}
		}
		return false
	})
	if ps.Depth() != 1 || ps.Mode() == ModeJetStream || streamCount(reader) != 4 {
		t.Errorf("shared prefix: outbox %d, mode %s, stream %d; want the event still waiting", ps.Depth(), ps.Mode(), streamCount(reader))
	}
}

// TestAuthNodeStatusOwnOnly: with the per-node permissions a node puts its
// own last value and the server refuses a put under another node's name.
func TestAuthNodeStatusOwnOnly(t *testing.T) {
	seed1, pub1 := newNodeKey(t)
	_, pub2 := newNodeKey(t)
	s := startAuthServer(t, nodeUser(pub1, "n1"), nodeUser(pub2, "n2"))
	n1, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "n1", NkeyFile: seed1,
		InboxPrefix: InboxPrefix("c1", "n1"), FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n1.Close)
	own, err := NewStatusWriter(n1, StatusOptions{Cluster: "c1", Node: "n1", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Put(context.Background(), map[string]int{"disk": 1}); err != nil {
		t.Fatalf("own status: %v", err)
	}
	other, err := NewStatusWriter(n1, StatusOptions{Cluster: "c1", Node: "n2", Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Put(context.Background(), map[string]int{"disk": 99}); err == nil {
		t.Fatal("n1 put n2's status")
	}
}
