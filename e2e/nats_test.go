package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"
)

// The agent's identity in these tests: testenv.StartAgent names the node.
const (
	natsCluster = "default"
	natsNode    = "test-node"
)

// documentedTypes are the only event types of the NATS contract (docs/architecture.md).
var documentedTypes = []string{
	"agent.started", "agent.heartbeat", "agent.state_reset",
	"image.removed", "image.skipped", "container.removed", "log.removed",
	"gc.started", "gc.completed", "gc.failed", "image.regretted",
}

// storedEvent is one message of the events stream.
type storedEvent struct {
	natsbus.CloudEvent
	Seq        uint64
	NATSSubj   string
	MsgID      string
	Header     nats.Header
	KindAction string // kind.action from the type
}

// natsConn connects a test client; it is closed at the end of the test.
func natsConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("e2e"), nats.Timeout(2*time.Second), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// readStream returns every message in the events stream, in order; none
// when the stream does not exist yet or NATS does not answer.
func readStream(t testing.TB, nc *nats.Conn) []storedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, natsbus.DefaultStream)
	if err != nil {
		return nil
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		return nil
	}
	var out []storedEvent
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		ev := storedEvent{Seq: seq, NATSSubj: m.Subject, MsgID: m.Header.Get(nats.MsgIdHdr), Header: m.Header}
		if err := json.Unmarshal(m.Data, &ev.CloudEvent); err != nil {
			t.Fatalf("stream message %d is not a CloudEvent: %v: %s", seq, err, m.Data)
		}
		ev.KindAction = strings.TrimPrefix(ev.Type, "io.gcagent.")
		out = append(out, ev)
	}
	return out
}

// checkContract fails the test for every stored event that breaks the
// contract: a field missing or inconsistent, a type that is not
// documented, or an id stored more than once. It returns the count per type.
func checkContract(t testing.TB, evs []storedEvent) map[string]int {
	t.Helper()
	ids := map[string]int{}
	types := map[string]int{}
	for _, ev := range evs {
		ids[ev.ID]++
		types[ev.KindAction]++
		kind, action, _ := strings.Cut(ev.KindAction, ".")
		var problems []string
		if ev.SpecVersion != "1.0" {
			problems = append(problems, "specversion "+ev.SpecVersion)
		}
		if len(ev.ID) != 32 || ev.MsgID != ev.ID {
			problems = append(problems, fmt.Sprintf("id %q, Nats-Msg-Id %q", ev.ID, ev.MsgID))
		}
		if ev.Source != "gcagent/"+natsCluster+"/"+natsNode {
			problems = append(problems, "source "+ev.Source)
		}
		if !slices.Contains(documentedTypes, ev.KindAction) {
			problems = append(problems, "undocumented type "+ev.Type)
		}
		if want := natsbus.Subject(natsCluster, natsNode, kind, action); ev.NATSSubj != want {
			problems = append(problems, fmt.Sprintf("NATS subject %s, want %s", ev.NATSSubj, want))
		}
		if ev.Subject == "" || ev.Time.IsZero() || time.Since(ev.Time) > time.Hour || ev.DataContentType != "application/json" || !json.Valid(ev.Data) {
			problems = append(problems, fmt.Sprintf("subject %q time %v datacontenttype %q data %s", ev.Subject, ev.Time, ev.DataContentType, ev.Data))
		}
		if ev.Header.Get("Content-Type") != natsbus.ContentType || ev.Header.Get("Gcagent-Schema") != natsbus.Schema || ev.Header.Get("Gcagent-Node") != natsNode {
			problems = append(problems, fmt.Sprintf("headers %v", ev.Header))
		}
		if len(problems) > 0 {
			t.Errorf("stream seq %d (%s): %s", ev.Seq, ev.Type, strings.Join(problems, "; "))
		}
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("event %s stored %d times", id, n)
		}
	}
	return types
}

// subjectsOf counts the stored events of kind.action by CloudEvent subject.
func subjectsOf(evs []storedEvent, kindAction string) map[string]int {
	out := map[string]int{}
	for _, ev := range evs {
		if ev.KindAction == kindAction {
			out[ev.Subject]++
		}
	}
	return out
}

// metricSum sums every sample of metric name in a /metrics text.
func metricSum(text, name string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			f := strings.Fields(l)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// danglingLog creates a kubelet-style log symlink for container id (which
// does not exist) pointing at a file that does not exist, in a directory
// that does: the agent judges a target gone only in a directory it sees
// (issue 34 item 2). That directory is reached through
// <pod-log-dir>/gone_<name>, a symlink to a directory elsewhere, so that
// it is not a pod dir the agent would remove too. (An agent in a pod does
// not see elsewhere: danglingLogIn.) The daemon runs a pod, as a node
// does (nodePod).
func danglingLog(t *testing.T, c *testenv.Containerd, name, id string) string {
	t.Helper()
	nodePod(t, c)
	holder := t.TempDir()
	podDir := filepath.Join(c.PodLogDir, "gone_"+name)
	if _, err := os.Lstat(podDir); os.IsNotExist(err) {
		if err := os.Symlink(holder, podDir); err != nil {
			t.Fatal(err)
		}
	}
	return danglingLogIn(t, c, podDir, name, id)
}

// nodePods holds the addresses of the daemons nodePod ran a pod on.
var nodePods sync.Map

// nodePod runs a CRI pod on c, once per daemon, as every node runs some:
// its sandbox's log dir in the pod log dir shows the agent that the pod
// log dir is the watched containerd's. Without that it removes no
// dangling link of a container it does not know: the container may be
// another containerd's, running (issue 42 item 2).
func nodePod(t *testing.T, c *testenv.Containerd) {
	t.Helper()
	if _, done := nodePods.LoadOrStore(c.Address, true); done {
		return
	}
	c.Import(t, testenv.Pause(c.SandboxImage))
	rt, _ := c.CRI(t)
	c.RunPod(t, rt, "node", "kube-system", "0d0e0000-node")
}

// danglingLogIn is danglingLog with the missing file in podDir/app.
func danglingLogIn(t *testing.T, c *testenv.Containerd, podDir, name, id string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(podDir, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(c.LogDir, fmt.Sprintf("%s_default_app-%s.log", name, id))
	if err := os.Symlink(filepath.Join(podDir, "app", "0.log"), link); err != nil {
		t.Fatal(err)
	}
	return link
}

// deliveredStream reads the stream once the agent's outbox is empty; why
// says what is not there yet (the outbox, or the agent's answer).
func deliveredStream(t testing.TB, a *testenv.Agent, nc *nats.Conn) (evs []storedEvent, why string) {
	m, err := metricsText(a)
	if err != nil {
		return nil, err.Error()
	}
	if d := metricSum(m, "gcagent_natsbus_outbox_depth"); d != 0 {
		return nil, fmt.Sprintf("outbox depth %v", d)
	}
	return readStream(t, nc), ""
}

// metricsText fetches the agent's /metrics; an agent that is still
// starting is an error, not a failure.
func metricsText(a *testenv.Agent) (string, error) {
	_, text, err := a.GetText("/metrics")
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	return text, nil
}

// checkTypes counts events by kind.action.
func checkTypes(evs []storedEvent) map[string]int {
	out := map[string]int{}
	for _, ev := range evs {
		out[ev.KindAction]++
	}
	return out
}

// natsWaitSynced waits until the agent's projection has listed containerd.
func natsWaitSynced(t testing.TB, a *testenv.Agent) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() string {
		var rep struct {
			Synced bool `json:"synced"`
		}
		if code, err := a.Get("/status", &rep); err != nil || code != 200 || !rep.Synced {
			return fmt.Sprintf("agent not synced (%d %v)", code, err)
		}
		return ""
	})
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func containerGone(t *testing.T, c *testenv.Containerd, id string) bool {
	t.Helper()
	ctrs, err := c.Client.ContainerService().List(c.Ctx(), "id=="+id)
	if err != nil {
		t.Fatalf("list %s: %v", id, err)
	}
	return len(ctrs) == 0
}

func imageGone(t *testing.T, c *testenv.Containerd, name string) bool {
	t.Helper()
	imgs, err := c.Client.ImageService().List(c.Ctx(), "name=="+name)
	if err != nil {
		t.Fatalf("list %s: %v", name, err)
	}
	return len(imgs) == 0
}

// usagePercent is the kubelet's usage of the filesystem of dir, rounded up.
func usagePercent(t *testing.T, dir string) int {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int(math.Ceil(100 - float64(st.Bavail)*100/float64(st.Blocks)))
}

// TestNATSEveryActionExactlyOnce: the agent, publishing to an external NATS
// server with JetStream, deletes images under disk pressure, exited native
// containers and dangling log symlinks; every removal appears in the stream
// exactly once with the documented CloudEvent fields, the stream holds
// nothing but documented kinds and actions, the agent answers control
// requests, and `gcagent watch --json` replays the same events.
func TestNATSEveryActionExactlyOnce(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		recs := c.Import(t,
			testenv.Pause(c.SandboxImage),
			testenv.Runnable("example.test/keep:1", testenv.Layer{Seed: "keep", Size: 2 << 20}),
			testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 2 << 20}),
			testenv.Image{Name: "example.test/idle-a:1", Layers: []testenv.Layer{{Seed: "idle-a", Size: 4 << 20}}},
			testenv.Image{Name: "example.test/idle-b:1", Layers: []testenv.Layer{{Seed: "idle-b", Size: 4 << 20}}},
		)
		digest := map[string]string{}
		for _, r := range recs {
			digest[r.Name] = r.Target.Digest.String()
		}
		c.RunNative(t, "run-1", "example.test/keep:1", "sleep", "600")
		// Exited before the agent starts: their image is in use until they go.
		jobs := []string{"job-1", "job-2"}
		for _, id := range jobs {
			c.WaitExit(t, c.RunNative(t, id, "example.test/job:1", "sh", "-c", "exit 3"))
		}
		// Disk pressure that lasts: usage stays above the high threshold (1%)
		// after every delete and the low one (0%) cannot be reached, so every
		// image that becomes eligible goes, the exited jobs' image once the
		// container GC has removed them.
		if u := usagePercent(t, c.Root); u < 2 {
			t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
		}
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--nats-url", ns.ClientURL(),
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "0s", "--uncollected-exit-grace", "1s",
			"--pod-log-grace", "1s", "--heartbeat-interval", "1s")
		natsWaitSynced(t, a)

		links := []string{danglingLog(t, c, "web", "0123456789abcdef01"), danglingLog(t, c, "db", "fedcba9876543210fe")}

		wantImages := []string{"example.test/idle-a:1", "example.test/idle-b:1", "example.test/job:1"}
		testenv.Eventually(t, 60*time.Second, func() string {
			for _, id := range jobs {
				if !containerGone(t, c, id) {
					return "container " + id + " not removed"
				}
			}
			for _, n := range wantImages {
				if !imageGone(t, c, n) {
					return "image " + n + " not removed"
				}
			}
			for _, l := range links {
				if exists(l) {
					return "log link " + l + " not removed"
				}
			}
			m := mustMetrics(t, a)
			if d := metricSum(m, "gcagent_natsbus_outbox_depth"); d != 0 {
				return fmt.Sprintf("outbox depth %v", d)
			}
			evs := readStream(t, nc)
			if n := len(subjectsOf(evs, "agent.heartbeat")); n == 0 {
				return "no heartbeat stored"
			}
			// An object is gone in containerd a moment before the agent
			// counts and publishes its removal (a loaded machine makes the
			// moment long): wait for each event, not only for the counts.
			for _, n := range wantImages {
				if subjectsOf(evs, "image.removed")[digest[n]] == 0 {
					return "no image.removed for " + n + " in the stream yet"
				}
			}
			for _, id := range jobs {
				if subjectsOf(evs, "container.removed")[id] == 0 {
					return "no container.removed for " + id + " in the stream yet"
				}
			}
			for _, l := range links {
				if subjectsOf(evs, "log.removed")[l] == 0 {
					return "no log.removed for " + l + " in the stream yet"
				}
			}
			removed := len(subjectsOf(evs, "image.removed")) + len(subjectsOf(evs, "container.removed")) + len(subjectsOf(evs, "log.removed"))
			if want := metricSum(m, "gcagent_image_gc_images_removed_total") + metricSum(m, "gcagent_container_gc_containers_removed_total") +
				metricSum(m, "gcagent_logs_removed_total"); float64(removed) != want {
				return fmt.Sprintf("stream holds %d removals, the agent counts %v", removed, want)
			}
			return ""
		})
		if containerGone(t, c, "run-1") || imageGone(t, c, "example.test/keep:1") {
			t.Fatal("the running container or its image was deleted")
		}

		// Control requests over NATS reach the real agent.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		caller, err := natsbus.Connect(natsbus.ConnOptions{URL: ns.ClientURL(), Node: "e2e-operator"})
		if err != nil {
			t.Fatal(err)
		}
		defer caller.Close()
		r, err := natsbus.Request(ctx, caller, natsCluster, natsNode, natsbus.VerbStatus, natsbus.RequestOptions{ID: "st-1"})
		var st struct {
			Images int    `json:"images"`
			Synced bool   `json:"synced"`
			Node   string `json:"node"`
			Outbox int    `json:"outbox"`
		}
		if err != nil || !r.OK || json.Unmarshal(r.Data, &st) != nil || !st.Synced || st.Node != natsNode || st.Images < 2 {
			t.Errorf("status: %+v %v (%+v)", r, err, st)
		}
		r, err = natsbus.Request(ctx, caller, natsCluster, natsNode, natsbus.VerbExplain, natsbus.RequestOptions{ID: "ex-1",
			Args: natsbus.ExplainArgs{Image: "example.test/keep:1"}})
		if err != nil || !r.OK || !strings.Contains(string(r.Data), `"decision":"keep"`) || !strings.Contains(string(r.Data), `"reason":"in-use-by-snapshot"`) {
			t.Errorf("explain of the image in use: %+v %v", r, err)
		}
		r, err = natsbus.Request(ctx, caller, natsCluster, natsNode, natsbus.VerbPlan, natsbus.RequestOptions{ID: "pl-1"})
		if err != nil || !r.OK || !strings.Contains(string(r.Data), `"containers"`) {
			t.Errorf("plan: %+v %v", r, err)
		}
		r, err = natsbus.Request(ctx, caller, natsCluster, natsNode, natsbus.VerbGC, natsbus.RequestOptions{ID: "gc-1"})
		if err != nil || r.OK || r.Error != natsbus.ErrRemoteGCDisabled.Error() {
			t.Errorf("gc without --allow-remote-gc: %+v %v", r, err)
		}
		// The reply goes out before the request's log line is written.
		testenv.Eventually(t, 10*time.Second, func() string {
			if !logHas(t, a, `"request_id":"gc-1"`) {
				return "the agent did not log the refused gc request"
			}
			return ""
		})

		evs := readStream(t, nc)
		types := checkContract(t, evs)
		t.Logf("stream: %d events %v", len(evs), types)
		if types["agent.started"] != 1 {
			t.Errorf("agent.started stored %d times", types["agent.started"])
		}
		for _, id := range jobs {
			if n := subjectsOf(evs, "container.removed")[id]; n != 1 {
				t.Errorf("container %s: %d removal events", id, n)
			}
		}
		for _, l := range links {
			if n := subjectsOf(evs, "log.removed")[l]; n != 1 {
				t.Errorf("log link %s: %d removal events", l, n)
			}
		}
		// Each image removal event names an image that is gone, once; the
		// images we wanted gone are among them; kept ones are not.
		for d, n := range subjectsOf(evs, "image.removed") {
			if n != 1 {
				t.Errorf("image %s: %d removal events", d, n)
			}
			for name, dd := range digest {
				if dd == d && !imageGone(t, c, name) {
					t.Errorf("removal event for %s, which still exists", name)
				}
			}
		}
		for _, name := range wantImages {
			if subjectsOf(evs, "image.removed")[digest[name]] != 1 {
				t.Errorf("no single removal event for image %s", name)
			}
		}
		if subjectsOf(evs, "image.removed")[digest["example.test/keep:1"]] != 0 {
			t.Errorf("removal event for the image in use")
		}

		// gcagent watch --json replays the same events.
		out := runWatch(t, ns.ClientURL(), len(evs))
		got := map[string]bool{}
		for _, ev := range out {
			got[ev.ID] = true
		}
		for _, ev := range evs {
			if !got[ev.ID] {
				t.Errorf("watch --json did not print %s %s", ev.Type, ev.ID)
			}
		}
	})
}

// runWatch runs `gcagent watch --json` until it has printed at least n
// events and returns them.
func runWatch(t *testing.T, url string, n int) []natsbus.CloudEvent {
	t.Helper()
	cmd := exec.Command(testenv.AgentBinary(t), "watch", "--json", "--nats-url", url, "--since", "1h")
	return watchJSON(t, cmd, 20*time.Second, func(evs []natsbus.CloudEvent) string {
		if len(evs) < n {
			return fmt.Sprintf("watch printed %d of %d events", len(evs), n)
		}
		return ""
	})
}

// natsAt starts NATS with JetStream on a fixed loopback port and store, so
// that it can be stopped and started again as the same server.
func natsAt(t *testing.T, port int, store string) *server.Server {
	t.Helper()
	return testenv.StartNATS(t, testenv.NATSOptions{JetStream: true, Port: port, StoreDir: store})
}

func stopNATS(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// runDead starts native containers that exit at once.
func runDead(t *testing.T, c *testenv.Containerd, ids ...string) {
	t.Helper()
	for _, id := range ids {
		c.RunNative(t, id, "example.test/job:1", "true")
	}
}

// waitRemoved waits until containerd has none of ids.
func waitRemoved(t *testing.T, c *testenv.Containerd, ids ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() string {
		for _, id := range ids {
			if !containerGone(t, c, id) {
				return "container " + id + " not removed"
			}
		}
		return ""
	})
}

// waitDelivered waits until the agent's outbox is empty and the stream
// holds one container.removed for each of ids, then checks the whole
// stream against the contract.
func waitDelivered(t *testing.T, a *testenv.Agent, nc *nats.Conn, ids []string, started int) []storedEvent {
	t.Helper()
	var evs []storedEvent
	testenv.Eventually(t, 60*time.Second, func() string {
		var why string
		if evs, why = deliveredStream(t, a, nc); why != "" {
			return why
		}
		removed := subjectsOf(evs, "container.removed")
		for _, id := range ids {
			if removed[id] == 0 {
				return "no removal event for " + id
			}
		}
		if n := checkTypes(evs)["agent.started"]; n < started {
			return fmt.Sprintf("%d agent.started events", n)
		}
		return ""
	})
	types := checkContract(t, evs)
	t.Logf("stream: %d events %v", len(evs), types)
	removed := subjectsOf(evs, "container.removed")
	for _, id := range ids {
		if removed[id] != 1 {
			t.Errorf("container %s: %d removal events", id, removed[id])
		}
	}
	if len(removed) != len(ids) {
		t.Errorf("removal events for %d containers, want %d: %v", len(removed), len(ids), removed)
	}
	if n := checkTypes(evs)["agent.started"]; n != started {
		t.Errorf("%d agent.started events, want %d", n, started)
	}
	return evs
}

// TestNATSOutageAndKill9: (b) NATS is down for 60 s while the agent keeps
// removing dead containers; after NATS returns on the same port and store,
// every action is stored exactly once. (c) NATS goes down again, the agent
// removes more and is killed with SIGKILL while the events wait in its
// outbox; NATS and the agent restart on the same state: every event is
// stored exactly once. One containerd version suffices: this tests the
// delivery of events to NATS, which does not depend on the daemon (the
// removals themselves are tested on every version elsewhere).
func TestNATSOutageAndKill9(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
	port, _ := strconv.Atoi(strings.TrimPrefix(testenv.FreeAddr(t), "127.0.0.1:"))
	store := t.TempDir()
	ns := natsAt(t, port, store)
	url := ns.ClientURL()
	nc := natsConn(t, url)
	state := filepath.Join(t.TempDir(), "state")
	flags := []string{"--nats-url", url, "--uncollected-exit-grace", "1s",
		"--image-gc-high-threshold", "100", "--heartbeat-interval", "1s"}
	a := testenv.StartAgent(t, c, state, flags...)
	natsWaitSynced(t, a)
	runDead(t, c, "before-1")
	waitRemoved(t, c, "before-1")
	waitDelivered(t, a, nc, []string{"before-1"}, 1)

	// (b) Outage: GC goes on, events wait in the outbox.
	stopNATS(ns)
	outage := time.Now()
	during := []string{"out-1", "out-2", "out-3"}
	for _, id := range during {
		runDead(t, c, id)
		waitRemoved(t, c, id)
	}
	testenv.Eventually(t, 10*time.Second, func() string {
		m := mustMetrics(t, a)
		if metricSum(m, "gcagent_natsbus_outbox_depth") < float64(len(during)) || metricSum(m, `gcagent_natsbus_mode{mode="disconnected"}`) != 1 {
			return "removals made during the outage are not waiting in the outbox"
		}
		return ""
	})
	time.Sleep(time.Until(outage.Add(60 * time.Second))) // the outage itself, not a wait for an outcome
	ns = natsAt(t, port, store)
	waitDelivered(t, a, nc, append([]string{"before-1"}, during...), 1)

	// (c) kill -9 with events in the outbox.
	stopNATS(ns)
	killed := []string{"kill-1", "kill-2"}
	runDead(t, c, killed...)
	waitRemoved(t, c, killed...)
	// A container is gone in containerd before the agent has published its
	// removal, and heartbeats fill the outbox too, so neither says the
	// removals are in the outbox: the container GC's pass count does, as a
	// pass is recorded after its removals are published.
	testenv.Eventually(t, 30*time.Second, func() string {
		if n, want := containerGCRemoved(t, a), uint64(1+len(during)+len(killed)); n < want {
			return fmt.Sprintf("container GC reports %d removals, want %d before the kill", n, want)
		}
		if d := metricSum(mustMetrics(t, a), "gcagent_natsbus_outbox_depth"); d < float64(len(killed)) {
			return fmt.Sprintf("outbox depth %v before the kill", d)
		}
		return ""
	})
	a.Kill()
	natsAt(t, port, store)
	a2 := testenv.StartAgent(t, c, state, flags...)
	waitDelivered(t, a2, nc, append(append([]string{"before-1"}, during...), killed...), 2)
}

// containerGCRemoved is the container GC's count of removals since the
// agent started, from /status (0 while the agent does not answer).
func containerGCRemoved(t testing.TB, a *testenv.Agent) uint64 {
	t.Helper()
	var st struct {
		ContainerGC *struct {
			Removed uint64 `json:"removed"`
		} `json:"containerGC"`
	}
	if code, err := a.Get("/status", &st); err != nil || code != 200 || st.ContainerGC == nil {
		return 0
	}
	return st.ContainerGC.Removed
}

// TestSlimBinary: the agent built without the embedded NATS server (-tags
// noembeddednats, for nodes that publish to a fleet NATS) links none of
// nats-server's code, refuses to run without --nats-url (status 2, one
// line, nothing written), and with one prunes a dead container and stores
// its removal exactly once, on both daemons.
func TestSlimBinary(t *testing.T) {
	t.Parallel()
	full, slim := testenv.AgentBinary(t), testenv.AgentBuild(t, testenv.Build{Tags: "noembeddednats"})
	for bin, want := range map[string]bool{full: true, slim: false} {
		out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v\n%s", bin, err, out)
		}
		if got := strings.Contains(string(out), "github.com/nats-io/nats-server/v2"); got != want {
			t.Errorf("%s links nats-server: %v, want %v", bin, got, want)
		}
	}
	fullSize, slimSize := fileSize(t, full), fileSize(t, slim)
	t.Logf("binary: %.1f MiB, without the embedded server %.1f MiB", float64(fullSize)/(1<<20), float64(slimSize)/(1<<20))

	state := filepath.Join(t.TempDir(), "state")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a run that starts would never end
	defer cancel()
	cmd := exec.CommandContext(ctx, slim, "run", "--state-dir", state)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(stderr.String(), "--nats-url") ||
		strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
		t.Errorf("run without --nats-url: %v, status %d, stderr %q; want status 2 and one line naming --nats-url", err, code, stderr.String())
	}
	if exists(state) {
		t.Errorf("run without --nats-url created %s", state)
	}

	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		a := testenv.StartAgentBin(t, slim, c, filepath.Join(t.TempDir(), "state"), nil, "--nats-url", ns.ClientURL(),
			"--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100")
		natsWaitSynced(t, a)
		runDead(t, c, "slim-1")
		waitRemoved(t, c, "slim-1")
		waitDelivered(t, a, nc, []string{"slim-1"}, 1)
	})
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
