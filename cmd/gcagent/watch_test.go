package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/fleet"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
)

func ce(t *testing.T, node, kind, action, subject string, at time.Time, data any) natsbus.CloudEvent {
	t.Helper()
	ev, err := natsbus.NewEvent("c1", node, natsbus.Action{Kind: kind, Action: action, Subject: subject, Key: at.String() + subject, Data: data}, at)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestWatchTable: the table shows each node's figures as of now and the
// URL without its credentials.
func TestWatchTable(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := fleet.New(3)
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "agent", "started", "n1", t0, nil),
		ce(t, "n1", "agent", "heartbeat", "n1", t0.Add(time.Minute), map[string]any{"diskUsagePercent": 91, "images": 12, "outbox": 0, "natsMode": "jetstream"}),
		ce(t, "n1", "gc", "completed", "image", t0.Add(-2*time.Hour), map[string]any{"freedBytes": 1 << 30}),
		ce(t, "n1", "gc", "completed", "image", t0.Add(50*time.Minute), map[string]any{"freedBytes": 300 << 20, "trigger": "disk"}),
		ce(t, "n1", "image", "removed", "sha256:aa", t0.Add(50*time.Minute), map[string]any{"bytes": 300 << 20, "reason": "space"}),
		ce(t, "n1", "container", "removed", "c-1", t0.Add(51*time.Minute), map[string]any{"reason": "per-unit-cap"}),
		ce(t, "n2", "gc", "failed", "image", t0.Add(55*time.Minute), map[string]any{"freedBytes": 0, "error": "boom"}),
		ce(t, "n2", "image", "skipped", "sha256:bb", t0.Add(55*time.Minute), map[string]any{"reason": "delete-failed"}),
		ce(t, "n1", "agent", "heartbeat", "n1", t0.Add(30*time.Second), map[string]any{"diskUsagePercent": 50, "images": 1}),
	} {
		f.Apply(ev)
	}
	var out bytes.Buffer
	renderFleet(&out, f, t0.Add(time.Hour), "nats://u:p@127.0.0.1:4222", 0)
	for _, want := range []string{"91%", "300.0MiB", "n2", "(failed)", "1/1/0", "c-1", "nats://***@127.0.0.1:4222"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTailDetail: the detail column says the reason, or a pass's trigger
// instead, then the bytes and the error.
func TestTailDetail(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    fleet.TailLine
		want string
	}{
		{"empty", fleet.TailLine{}, ""},
		{"reason", fleet.TailLine{Reason: "space"}, "space"},
		{"reason and bytes", fleet.TailLine{Reason: "space", Bytes: 1 << 20}, "space est. 1.0MiB"},
		{"measured bytes", fleet.TailLine{Reason: "space", Bytes: 1 << 20, Measured: true}, "space freed 1.0MiB"},
		{"trigger wins", fleet.TailLine{Reason: "x", Trigger: "disk"}, "trigger=disk"},
		{"bytes alone", fleet.TailLine{Bytes: 1 << 20}, "est. 1.0MiB"},
		{"all", fleet.TailLine{Trigger: "disk", Bytes: 1 << 20, Error: "boom"}, "trigger=disk est. 1.0MiB error=boom"},
		{"error alone", fleet.TailLine{Error: "boom"}, "error=boom"},
		// A dry run says so: d7dd547 showed a would-remove as a plain skip.
		{"dry run's would-remove", fleet.TailLine{Type: "container.skipped", Reason: "ttl-expired", DryRun: true}, "dry run: would remove (ttl-expired)"},
		{"dry run image", fleet.TailLine{Type: "image.skipped", Reason: "space", Bytes: 1 << 20, DryRun: true}, "dry run: would remove (space) est. 1.0MiB"},
		{"dry run's pass", fleet.TailLine{Type: "gc.completed", Trigger: "disk", Bytes: 1 << 20, DryRun: true}, "dry run trigger=disk est. 1.0MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tailDetail(tc.l); got != tc.want {
				t.Errorf("tailDetail = %q, want %q", got, tc.want)
			}
		})
	}
}

// syncBuffer is a goroutine-safe bytes.Buffer.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startTestNATS(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func newTestPublisher(t *testing.T, url, cluster, node string) *natsbus.Publisher {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: url, Cluster: cluster, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	p, err := natsbus.NewPublisher(nc, natsbus.PublisherOptions{Cluster: cluster, Node: node, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(); nc.Close() })
	return p
}

// TestWatchJSONReplaysThenFollows: watch --json prints what was stored
// before it started (within --since) and what comes after, for its cluster
// only, each CloudEvent once.
func TestWatchJSONReplaysThenFollows(t *testing.T) {
	s := startTestNATS(t)
	p1 := newTestPublisher(t, s.ClientURL(), "c1", "n1")
	pOther := newTestPublisher(t, s.ClientURL(), "c2", "x1")
	for i := range 3 {
		if err := p1.Publish(natsbus.Action{Kind: "image", Action: "removed", Subject: "sha256:before", Key: "before-" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pOther.Publish(natsbus.Action{Kind: "image", Action: "removed", Subject: "sha256:other", Key: "other"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, func() string {
		if p1.Depth()+pOther.Depth() > 0 {
			return "publishers not drained"
		}
		return ""
	})
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, []string{"watch", "--nats-url", s.ClientURL(), "--cluster", "c1", "--json", "--since", "10m"}, nil, &out, &errOut)
	}()
	lines := func() []natsbus.CloudEvent {
		var evs []natsbus.CloudEvent
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var ev natsbus.CloudEvent
			if l != "" && json.Unmarshal([]byte(l), &ev) == nil && ev.ID != "" { // not a status or loaded line
				evs = append(evs, ev)
			}
		}
		return evs
	}
	wait.For(t, 10*time.Second, func() string {
		if n := len(lines()); n != 3 {
			return "replayed " + out.String()
		}
		return ""
	})
	if err := p1.Publish(natsbus.Action{Kind: "container", Action: "removed", Subject: "c-live", Key: "live"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, func() string {
		evs := lines()
		if len(evs) != 4 || evs[3].Subject != "c-live" {
			return "after live publish: " + out.String()
		}
		return ""
	})
	for _, ev := range lines() {
		if ev.Source != "gcagent/c1/n1" {
			t.Errorf("event of another cluster: %+v", ev)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v (%s)", err, errOut.String())
	}
}

// TestCtlCommand: gcagent ctl asks every node (or one) and prints replies;
// the request carries the tool's connection name as its caller.
func TestCtlCommand(t *testing.T) {
	s := startTestNATS(t)
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var logs syncBuffer
	live, err := projection.NewSpaces(projection.SpacesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Cluster, cfg.NodeName, cfg.ImageFS = "c1", "n1", t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natsbus.ServeControl(ctx, nc, agent.NewControl(cfg, live), natsbus.ControlOptions{Cluster: "c1", Node: "n1", Logger: agent.NewLogger(cfg, &logs)})
	}()
	defer func() { cancel(); <-done }()
	wait.For(t, 5*time.Second, func() string {
		out, errOut, err := runCLI(context.Background(), nil, "ctl", "--nats-url", s.ClientURL(), "--cluster", "c1", "--node", "n1", "--timeout", "1s", "gc")
		if err == nil || !strings.Contains(out, "remote gc is disabled") {
			return "gc reply: " + out + errOut
		}
		return ""
	})
	// The node logs a request after it replied.
	wait.For(t, 5*time.Second, func() string {
		if !strings.Contains(logs.String(), `"caller":"gcagent/c1/ctl@`) || !strings.Contains(logs.String(), `"component":"control"`) {
			return "control log does not name the ctl caller:\n" + logs.String()
		}
		return ""
	})
	// Flags before and after the verb alike.
	for _, args := range [][]string{
		{"ctl", "--nats-url", s.ClientURL(), "--cluster", "c1", "--timeout", "300ms", "--id", "x1", "--image", "x", "--json", "explain"},
		{"ctl", "explain", "--nats-url", s.ClientURL(), "--cluster", "c1", "--timeout", "300ms", "--id", "x1", "--image", "x", "--json"},
		{"ctl", "--nats-url", s.ClientURL(), "--cluster", "c1", "explain", "--timeout", "300ms", "--id", "x1", "--image", "x", "--json"},
	} {
		out, _, err := runCLI(context.Background(), nil, args...)
		var r natsbus.ControlReply
		if jerr := json.Unmarshal([]byte(out), &r); jerr != nil || r.ID != "x1" || r.Node != "n1" || r.OK || !strings.Contains(r.Error, "not known to this node") {
			t.Errorf("%v: explain of an unknown image to all: %v %s %v", args, err, out, jerr)
		}
	}
}

// TestCtlNamesWhatDoesNotAnswer: ctl with no agent says so, naming the
// URL, at once; with one agent on a fleet's NATS, --node all returns soon
// after its reply and prints it for a person.
func TestCtlNamesWhatDoesNotAnswer(t *testing.T) {
	run := func(args ...string) (string, error) {
		start := time.Now()
		out, _, err := runCLI(context.Background(), nil, append([]string{"ctl"}, args...)...)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("ctl %v took %s", args, took)
		}
		return out, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "nats://" + ln.Addr().String()
	ln.Close()
	if _, err := run("--nats-url", dead, "status"); err == nil || !strings.Contains(err.Error(), "no agent answers on "+dead) {
		t.Errorf("dead URL: %v", err)
	}
	empty := t.TempDir()
	if _, err := run("--state-dir", empty, "status"); err == nil || !strings.Contains(err.Error(), "no agent listens for local tools with --state-dir "+empty) {
		t.Errorf("empty state dir: %v", err)
	}

	s := startTestNATS(t)
	if _, err := run("--nats-url", s.ClientURL(), "--cluster", "c1", "status"); err == nil ||
		!strings.Contains(err.Error(), "no agent of cluster c1 answers on "+s.ClientURL()) {
		t.Errorf("no agent on the server: %v", err)
	}
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: s.ClientURL(), Cluster: "c1", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	live, err := projection.NewSpaces(projection.SpacesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Cluster, cfg.NodeName, cfg.ImageFS = "c1", "n1", t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natsbus.ServeControl(ctx, nc, agent.NewControl(cfg, live), natsbus.ControlOptions{Cluster: "c1", Node: "n1"})
	}()
	defer func() { cancel(); <-done }()
	wait.For(t, 5*time.Second, func() string {
		out, err := run("--nats-url", s.ClientURL(), "--cluster", "c1", "--timeout", "10s", "status")
		if err != nil || !strings.Contains(out, "NODE") || !strings.Contains(out, "\nn1 ") {
			return fmt.Sprintf("status: %v\n%s", err, out)
		}
		return ""
	})
	out, err := run("--nats-url", s.ClientURL(), "--cluster", "c1", "plan")
	if err != nil || !strings.Contains(out, "n1  synced false; disk ") || !strings.Contains(out, "images: 0 to delete") {
		t.Errorf("plan: %v\n%s", err, out)
	}
	t.Logf("ctl plan:\n%s", out)
	out, err = run("--nats-url", s.ClientURL(), "--cluster", "c1", "--image", "app:1", "explain")
	if err == nil || !strings.Contains(out, `n1  error: image "app:1" is not known to this node`) {
		t.Errorf("explain of an unknown image: %v\n%s", err, out)
	}
}

// parseTool parses a NATS tool's args and env as ctl does; image is
// --image, a flag of the tool's own.
func parseTool(t *testing.T, args []string, env map[string]string) (cfg agent.Config, image string, err error) {
	t.Helper()
	cfg = agent.DefaultConfig()
	cmd := &cobra.Command{Use: "ctl"}
	addNATSClientFlags(cmd, &cfg)
	cmd.Flags().StringVar(&image, "image", "", "")
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	environ := environOf(env)
	c := &cli{environ: environ, env: lookupIn(environ), stdout: io.Discard, stderr: io.Discard}
	_, err = c.natsTool(cmd, &cfg)
	return cfg, image, err
}

// TestNATSClientEnvOnlySharedSettings: GCAGENT_<FLAG> sets the NATS
// settings shared with run; the other settings of run are left to run, and
// a variable named after a tool's own flag is unknown.
func TestNATSClientEnvOnlySharedSettings(t *testing.T) {
	cfg, _, err := parseTool(t, nil, map[string]string{"GCAGENT_NATS_URL": "nats://127.0.0.1:4999", "GCAGENT_KEEP_IMAGE": "x"})
	if err != nil || cfg.NATSURL != "nats://127.0.0.1:4999" {
		t.Errorf("nats url %q (%v), want it from GCAGENT_NATS_URL", cfg.NATSURL, err)
	}
	_, image, err := parseTool(t, nil, map[string]string{"GCAGENT_NATS_URL": "nats://127.0.0.1:4999", "GCAGENT_IMAGE": "evil:1"})
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "GCAGENT_IMAGE") || image != "" {
		t.Errorf("GCAGENT_IMAGE: %v, --image %q; want a usage error naming it and no image", err, image)
	}
}

// TestNATSClientLocalCredentials: without --nats-url or credentials, a
// local tool takes the URL and nkey from --state-dir (or GCAGENT_STATE_DIR);
// explicit settings win.
func TestNATSClientLocalCredentials(t *testing.T) {
	dir := t.TempDir()
	seed, _, err := natsbus.EnsureLocalNkey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := natsbus.WriteLocalURL(dir, "nats://127.0.0.1:4333"); err != nil {
		t.Fatal(err)
	}
	parse := func(args []string, env map[string]string) agent.Config {
		t.Helper()
		cfg, _, err := parseTool(t, args, env)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if c := parse([]string{"--state-dir", dir}, nil); c.NATSURL != "nats://127.0.0.1:4333" || c.NATSNKey != seed {
		t.Errorf("--state-dir: url %q nkey %q", c.NATSURL, c.NATSNKey)
	}
	if c := parse(nil, map[string]string{"GCAGENT_STATE_DIR": dir}); c.NATSURL != "nats://127.0.0.1:4333" || c.NATSNKey != seed {
		t.Errorf("GCAGENT_STATE_DIR: url %q nkey %q", c.NATSURL, c.NATSNKey)
	}
	if c := parse([]string{"--state-dir", dir, "--nats-url", "nats://10.0.0.1:4222"}, nil); c.NATSURL != "nats://10.0.0.1:4222" || c.NATSNKey != "" {
		t.Errorf("explicit URL: url %q nkey %q", c.NATSURL, c.NATSNKey)
	}
	if c := parse([]string{"--state-dir", t.TempDir()}, nil); c.NATSURL != "nats://127.0.0.1:4222" || c.NATSNKey != "" {
		t.Errorf("empty state dir: url %q nkey %q", c.NATSURL, c.NATSNKey)
	}
}

// TestWatchTableEscapesEventStrings: every string an event carries reaches
// the table escaped (terminal escape sequences, carriage returns, newlines,
// tabs, invisible format characters), while a valid non-ASCII name prints as is.
func TestWatchTableEscapesEventStrings(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	digest := "sha256:37d11ee8042e09d93c100b0ea6632dfac4c441333fb7729bd4925a3f6727b3df"
	f := fleet.New(20)
	odd := ce(t, "n1", "image", "removed", digest, t0.Add(6*time.Second), map[string]any{})
	odd.Type = "io.gcagent.image\x1b[8m.removed"
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "image", "removed", digest, t0, map[string]any{"digest": digest,
			"names": []string{"example.test/evil\x1b[31m:1"}, "freedBytes": 1 << 20}),
		ce(t, "n1", "image", "removed", digest, t0.Add(time.Second), map[string]any{"digest": digest,
			"names": []string{"example.test/café/日本語:1"}}),
		ce(t, "n1", "container", "removed", "3f2a9c0d1e2b3c4d5e6f", t0.Add(2*time.Second), map[string]any{
			"podNamespace": "default", "podName": "web", "containerName": "app\rOK"}),
		ce(t, "n1", "log", "removed", "/var/log/pods/ns_pod_uid/c/0.log\nFAKE-LINE", t0.Add(3*time.Second), map[string]any{"reason": "dangling\tlink"}),
		ce(t, "n1", "gc", "failed", "image", t0.Add(4*time.Second), map[string]any{"error": "boom\x1b[2J", "trigger": "disk\u202e"}),
		ce(t, "evil\x1b]0;owned\a", "agent", "heartbeat", "n", t0.Add(5*time.Second), map[string]any{"natsMode": "core\x1b[5m", "outbox": 1}),
		odd,
	} {
		f.Apply(ev)
	}
	var out bytes.Buffer
	renderFleet(&out, f, t0.Add(time.Minute), "nats://127.0.0.1:4222", 0)
	got := out.String()
	for _, r := range got {
		if r != '\n' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e') {
			t.Errorf("the table holds the raw control character %U:\n%s", r, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "FAKE-LINE") {
			t.Errorf("a newline in a path started a line of its own:\n%s", got)
		}
	}
	for _, want := range []string{
		`example.test/evil\x1b[31m:1`, // image name
		"example.test/café/日本語:1",     // valid non-ASCII: as is
		`app\rOK`,                     // container name
		`0.log\nFAKE-LINE`,            // log path
		`dangling\tlink`,              // reason
		`boom\x1b[2J`,                 // error
		`disk\u202e`,                  // trigger, a right-to-left override
		`evil\x1b]0;owned\a`,          // node
		`core\x1b[5m`,                 // NATS mode from a heartbeat
		`image\x1b[8m.removed`,        // event type
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the table lacks %q:\n%s", want, got)
		}
	}
}

// TestForTerminal: what forTerminal leaves as is and what it quotes.
func TestForTerminal(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "example.test/web:1", "example.test/web:1"},
		{"spaces", "default/web app (3f2a9c0d1e2b)", "default/web app (3f2a9c0d1e2b)"},
		{"non-ASCII", "café/日本語", "café/日本語"},
		{"empty", "", ""},
		{"escape sequence", "a\x1b[31mb", `"a\x1b[31mb"`},
		{"carriage return", "a\rb", `"a\rb"`},
		{"newline", "a\nb", `"a\nb"`},
		{"tab", "a\tb", `"a\tb"`},
		{"C1 control", "a\u009bb", `"a\u009bb"`},
		{"delete", "a\x7fb", `"a\x7fb"`},
		{"right-to-left override", "a\u202eb", `"a\u202eb"`},
		{"invalid UTF-8", "a\xffb", `"a\xffb"`},
		{"quote", `say "hi"`, `"say \"hi\""`},
		{"backslash", `a\x1b`, `"a\\x1b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := forTerminal(tc.in); got != tc.want {
				t.Errorf("forTerminal(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestRenderRegrets: the fleet view shows the regret rate per cluster and
// the images regretted most, and nothing while no image came back.
func TestRenderRegrets(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	f := fleet.New(10)
	var out strings.Builder
	renderFleet(&out, f, t0, "nats://127.0.0.1:4222", 0)
	if strings.Contains(out.String(), "REGRET") {
		t.Fatalf("regret section without a regret:\n%s", out.String())
	}
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "image", "removed", "sha256:aa", t0, map[string]any{"bytes": 3 << 20, "reason": "space"}),
		ce(t, "n1", "image", "removed", "sha256:bb", t0, map[string]any{"bytes": 1 << 20, "reason": "space"}),
		ce(t, "n1", "image", "regretted", "sha256:aa", t0.Add(time.Minute), schema.ImageRegret{Namespace: "k8s.io", Digest: "sha256:aa",
			Names: []string{"app:1"}, Bytes: 3 << 20, ReturnAfterSeconds: 60, Rule: "space", Trigger: "disk"}),
	} {
		f.Apply(ev)
	}
	out.Reset()
	renderFleet(&out, f, t0.Add(2*time.Minute), "nats://127.0.0.1:4222", 0)
	for _, want := range []string{"REGRET", "c1", "1 of 2 removals", "50.0%", "app:1", "1 times", "3.0MiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("fleet view lacks %q:\n%s", want, out.String())
		}
	}
}

// TestWatchTableSaysWhatItCounts: the REMOVED column names when its count
// starts (--since before watch tailed), a line says what the counting
// columns count, and a node without a heartbeat since its agent started is
// "starting", not stale under NEEDS A LOOK.
func TestWatchTableSaysWhatItCounts(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.Local)
	f := fleet.New(5)
	f.Apply(ce(t, "n1", "agent", "started", "n1", t0, nil))
	f.Apply(ce(t, "n2", "agent", "heartbeat", "n2", t0.Add(time.Minute), map[string]any{"diskUsagePercent": 10, "images": 1, "natsMode": "jetstream"}))
	f.Apply(ce(t, "n2", "image", "removed", "sha256:aa", t0, map[string]any{"reason": "space"}))
	v := defaultView
	v.from, v.since = t0.Add(-time.Minute), time.Minute
	var out bytes.Buffer
	renderView(&out, f, t0.Add(10*time.Second), "nats://127.0.0.1:4222", 0, v)
	text := out.String()
	for _, want := range []string{"REMOVED SINCE 11:59:00 (img/ctr/log)",
		"counted of the actions seen since 11:59:00 (--since 1m0s before watch started): FREED 1H and FAILURES 1H in the last hour, REMOVED all",
		"nodes 2 in 1 clusters, starting 1,"} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`\nc1\s+n1\s.*\sstarting\n`).MatchString(text) || strings.Contains(text, "NEEDS A LOOK") {
		t.Errorf("n1 should be starting and nothing need a look:\n%s", text)
	}
	out.Reset()
	renderView(&out, f, t0.Add(100*time.Second), "nats://127.0.0.1:4222", 0, v)
	if !regexp.MustCompile(`NEEDS A LOOK \(1 nodes, worst first\)\nc1\s+n1\s+stale`).MatchString(out.String()) {
		t.Errorf("after 3 intervals without a heartbeat n1 should be stale:\n%s", out.String())
	}
}
