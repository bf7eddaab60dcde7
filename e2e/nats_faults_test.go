package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// readyz returns the agent's /readyz status and body.
func readyz(a *testenv.Agent) (int, string, error) { return a.GetText("/readyz") }

// localTool runs `gcagent <args>` as a local operator would on the node: no
// NATS flags; only GCAGENT_STATE_DIR says where the agent keeps its state
// (the agent under test does not use the default /var/lib/gcagent).
func localTool(t *testing.T, stateDir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(testenv.AgentBinary(t), args...)
	cmd.Env = append(os.Environ(), "GCAGENT_STATE_DIR="+stateDir)
	return cmd
}

// localWatch runs `gcagent watch --json` with no NATS flags and returns the
// events it printed once cond holds for them.
func localWatch(t *testing.T, stateDir string, cond func([]natsbus.CloudEvent) string) []natsbus.CloudEvent {
	t.Helper()
	return watchJSON(t, localTool(t, stateDir, "watch", "--json", "--since", "1h"), 30*time.Second, cond)
}

// watchJSON runs a `gcagent watch --json` command and returns the events it
// printed once cond holds for them (waiting up to within).
func watchJSON(t *testing.T, cmd *exec.Cmd, within time.Duration, cond func([]natsbus.CloudEvent) string) []natsbus.CloudEvent {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var mu sync.Mutex
	var evs []natsbus.CloudEvent
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev natsbus.CloudEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.ID != "" { // not a {"status"} or {"loaded"} line
				mu.Lock()
				evs = append(evs, ev)
				mu.Unlock()
			}
		}
	}()
	testenv.Eventually(t, within, func() string {
		mu.Lock()
		defer mu.Unlock()
		if why := cond(evs); why != "" {
			return why + "; watch stderr: " + stderr.String()
		}
		return ""
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]natsbus.CloudEvent(nil), evs...)
}

// TestEmbeddedNATSPortTakenAndLocalAuth: the embedded server's port is
// taken when the agent starts. The server runs anyway, in process: the
// agent removes a dead container and the removal is stored at once (it
// no longer waits in the outbox for the port); the agent logs the bind
// failure, and /readyz says 200 with the address and the reason. When the
// port frees, the listener binds by itself; an anonymous client is
// refused; a local `gcagent watch` and `gcagent ctl status` work without
// NATS flags, with the credentials the agent wrote (0600) into its state
// dir. One containerd version suffices: nothing here depends on the
// daemon.
func TestEmbeddedNATSPortTakenAndLocalAuth(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state, "--embedded-nats-listen", addr,
		"--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100")
	natsWaitSynced(t, a)

	// GC works with the port taken, and its events are stored.
	runDead(t, c, "port-taken-1")
	waitRemoved(t, c, "port-taken-1")
	testenv.Eventually(t, 20*time.Second, func() string {
		code, body, err := readyz(a)
		if err != nil || code != http.StatusOK || !strings.Contains(body, "embedded NATS server cannot listen on "+addr) {
			return fmt.Sprintf("/readyz %d %q %v, want 200 naming the embedded server's address", code, body, err)
		}
		m, err := metricsText(a)
		if err != nil {
			return err.Error()
		}
		if metricSum(m, "gcagent_natsbus_embedded_up") != 1 || metricSum(m, "gcagent_natsbus_embedded_listening") != 0 ||
			metricSum(m, "gcagent_natsbus_embedded_listen_failures_total") < 1 || metricSum(m, "gcagent_natsbus_outbox_depth") != 0 {
			return "metrics do not show the server up, not listening, with every event stored:\n" + grepLines(m, "gcagent_natsbus_")
		}
		return ""
	})
	logb, _ := os.ReadFile(a.LogFile)
	if !strings.Contains(string(logb), "embedded NATS server cannot listen on its client address") {
		t.Errorf("the agent did not log the listen failure:\n%s", a.LogTail(20))
	}
	downSince := time.Now()

	// The port frees: the listener binds, local tools reach the server.
	busy.Close()
	testenv.Eventually(t, 30*time.Second, func() string {
		if code, body, err := readyz(a); err != nil || code != http.StatusOK || strings.Contains(body, "embedded") {
			return fmt.Sprintf("/readyz %d %q %v", code, body, err)
		}
		return ""
	})
	t.Logf("embedded server listening %s after the port was freed", time.Since(downSince).Round(time.Millisecond))
	if !logHas(t, a, "embedded NATS server listening after retrying") {
		t.Errorf("the agent did not log the listener coming up:\n%s", a.LogTail(20))
	}
	seed := filepath.Join(state, natsbus.LocalNkeyFile)
	fi, err := os.Stat(seed)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials %s: %v %v, want 0600", seed, fi, err)
	}
	if nc, err := nats.Connect("nats://"+addr, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected to the embedded server")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("anonymous client: %v, want an authorization error", err)
	}
	opt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+addr, opt, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("connect with the state dir's nkey: %v", err)
	}
	t.Cleanup(nc.Close)
	waitDelivered(t, a, nc, []string{"port-taken-1"}, 1)

	// Local tools without flags.
	evs := localWatch(t, state, func(evs []natsbus.CloudEvent) string {
		for _, ev := range evs {
			if ev.Type == "io.gcagent.container.removed" && ev.Subject == "port-taken-1" {
				return ""
			}
		}
		return fmt.Sprintf("watch printed %d events, none the removal of port-taken-1", len(evs))
	})
	t.Logf("local watch printed %d events without flags", len(evs))
	out, err := localTool(t, state, "ctl", "--json", "--timeout", "5s", "--node", natsNode, "status").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"ok":true`) {
		t.Errorf("local ctl status without flags: %v\n%s", err, out)
	}
}

// TestCorruptOutboxAgentRuns: the agent starts on a state dir whose
// outbox.db is garbage. It does not crash-loop: the file is kept as
// outbox.db.corrupt-<time>, the log and gcagent_natsbus_outbox_corrupt_total
// say so, and the next removal reaches the stream exactly once.
func TestCorruptOutboxAgentRuns(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
	ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	nc := natsConn(t, ns.ClientURL())
	state := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("this is not a bbolt file\n", 4000))
	if err := os.WriteFile(filepath.Join(state, natsbus.OutboxFile), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	a := testenv.StartAgent(t, c, state, "--nats-url", ns.ClientURL(),
		"--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100")
	natsWaitSynced(t, a)
	runDead(t, c, "after-corrupt-1")
	waitRemoved(t, c, "after-corrupt-1")
	waitDelivered(t, a, nc, []string{"after-corrupt-1"}, 1)
	moved, _ := filepath.Glob(filepath.Join(state, natsbus.OutboxFile+".corrupt-*"))
	if len(moved) != 1 {
		t.Fatalf("moved-aside files %v, want one", moved)
	}
	if b, err := os.ReadFile(moved[0]); err != nil || string(b) != string(garbage) {
		t.Errorf("the corrupt outbox was not kept as it was: %v", err)
	}
	m, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	if n := metricSum(m, "gcagent_natsbus_outbox_corrupt_total"); n != 1 {
		t.Errorf("gcagent_natsbus_outbox_corrupt_total %v, want 1", n)
	}
	logb, _ := os.ReadFile(a.LogFile)
	if !strings.Contains(string(logb), "outbox cannot be opened: moved it aside") {
		t.Errorf("no log line for the corrupt outbox:\n%s", a.LogTail(20))
	}
}

// perNodeAuthConfig is natsbus/auth_test.go's per-node model for the agent
// of these tests (cluster default, node test-node): it may publish only its
// events and the JetStream calls of its publisher, subscribe only to its
// control subjects and to its own reply inbox _INBOX.default.test-node.>;
// it may watch the fleet keep list (docs/nats.md's node permissions) but
// not write it, which the keeper user may.
const perNodeAuthConfig = `
listen: "127.0.0.1:-1"
server_name: auth-e2e
jetstream { store_dir: %q }
accounts {
  FLEET {
    jetstream: enabled
    users: [
      { nkey: %s, permissions: {
        publish: { allow: ["gcagent.v1.evt.default.test-node.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.GCAGENT_EVT", "$JS.API.STREAM.CREATE.GCAGENT_EVT",
          "gcagent.v1.status.default.test-node", "$JS.API.STREAM.INFO.GCAGENT_STATUS", "$JS.API.STREAM.CREATE.GCAGENT_STATUS",
          "$JS.API.STREAM.INFO.KV_gcagent_keep", "$JS.API.CONSUMER.CREATE.KV_gcagent_keep", "$JS.API.CONSUMER.CREATE.KV_gcagent_keep.>",
          "$JS.API.CONSUMER.DELETE.KV_gcagent_keep.>", "$JS.FC.KV_gcagent_keep.>"] }
        subscribe: { allow: ["gcagent.v1.ctl.default.test-node.>", "gcagent.v1.ctl.default.all.>", "_INBOX.default.test-node.>"] }
        allow_responses: { max: 1, expires: "1m" }
      } }
      { user: reader, password: r3ader, permissions: { publish: ["$JS.API.>"], subscribe: ["_INBOX.>"] } }
      { user: keeper, password: k33per, permissions: { publish: ["$JS.API.>", "$KV.gcagent_keep.>"], subscribe: ["_INBOX.>"] } }
    ]
    exports: [ { service: "gcagent.v1.ctl.>", response_type: stream } ]
  }
  OPS {
    users: [ { user: ops, password: s3cret } ]
    imports: [ { service: { account: FLEET, subject: "gcagent.v1.ctl.>" }, share: true } ]
  }
}
`

// TestPerNodeCredentialsEndToEnd: the agent binary with a node's nkey and
// the per-node authorization config (its replies only on its own inbox
// prefix) stores its events in JetStream (the acks reach it on
// _INBOX.default.test-node) and answers an operator's control request,
// with no permission violation in its log.
func TestPerNodeCredentialsEndToEnd(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "node.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(perNodeAuthConfig, t.TempDir(), pub)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	reader, err := nats.Connect(s.ClientURL(), nats.UserInfo("reader", "r3ader"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)

	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state, "--nats-url", s.ClientURL(), "--nats-nkey", seedFile,
		"--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100")
	natsWaitSynced(t, a)
	runDead(t, c, "per-node-1")
	waitRemoved(t, c, "per-node-1")
	waitDelivered(t, a, reader, []string{"per-node-1"}, 1)

	out, err := exec.Command(testenv.AgentBinary(t), "ctl", "--json", "--nats-url", s.ClientURL(), "--nats-user", "ops", "--nats-password", "s3cret",
		"--node", natsNode, "--timeout", "5s", "status").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"ok":true`) {
		t.Errorf("operator's ctl status: %v\n%s", err, out)
	}

	// The fleet keep list: the keeper writes it, the node's agent reads it
	// (it looked for the missing bucket at a backoff), the node cannot
	// write it.
	if out, err := exec.Command(testenv.AgentBinary(t), "ctl", "keep", "add", "example.test/kept:*", "--nats-url", s.ClientURL(),
		"--nats-user", "keeper", "--nats-password", "k33per").CombinedOutput(); err != nil {
		t.Fatalf("keeper's keep add: %v\n%s", err, out)
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		var p struct {
			Policy []struct{ Name, Value, Source string } `json:"policy"`
		}
		if code, err := a.Get("/plan", &p); err != nil || code != 200 {
			return fmt.Sprintf("plan %d %v", code, err)
		}
		for _, s := range p.Policy {
			if s.Name == "fleet-keep" && s.Value == "example.test/kept:*" {
				return ""
			}
		}
		return fmt.Sprintf("fleet-keep not applied: %+v", p.Policy)
	})
	if out, err := exec.Command(testenv.AgentBinary(t), "ctl", "keep", "add", "example.test/mine:*", "--nats-url", s.ClientURL(),
		"--nats-nkey", seedFile, "--timeout", "3s").CombinedOutput(); err == nil {
		t.Errorf("a node's credentials changed the fleet keep list:\n%s", out)
	}
	if logHas(t, a, "Permissions Violation") {
		t.Errorf("the agent hit a permission violation:\n%s", a.LogTail(30))
	}
}
