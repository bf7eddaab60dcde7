package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// logLines returns the agent's JSON log lines whose message is one of msgs.
func logLines(t *testing.T, a *testenv.Agent, msgs ...string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && slices.Contains(msgs, fmt.Sprint(m["message"])) {
			out = append(out, m)
		}
	}
	return out
}

// TestMissingSocketLogsAFewLines: the agent starts while containerd's
// socket and the image filesystem are missing; for the 10 s they stay
// missing, its log holds a handful of lines that name the socket's path
// (and the filesystem's), not one per attempt. Once the socket appears
// (a link to a running daemon's) the agent follows containerd within
// seconds and says how many attempts failed.
func TestMissingSocketLogsAFewLines(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v})
			dir := t.TempDir()
			sock := filepath.Join(dir, "later.sock")
			imageFS := filepath.Join(dir, "image-fs")
			missing := *c // the same daemon, reached through a socket that is not there yet
			missing.Address = sock
			a := testenv.StartAgent(t, &missing, filepath.Join(dir, "state"), "--image-fs", imageFS)
			const window = 10 * time.Second
			time.Sleep(window) // the outage itself, not a wait for a result

			socketLines := logLines(t, a, "cannot follow containerd")
			fsLines := logLines(t, a, "image filesystem not measured")
			t.Logf("in %s: %d lines about the socket, %d about the filesystem", window, len(socketLines), len(fsLines))
			for _, l := range socketLines {
				if !strings.Contains(fmt.Sprint(l["error"]), "containerd socket "+sock+" does not exist") {
					t.Errorf("socket line does not name the cause and path: %v", l)
				}
			}
			for _, l := range fsLines {
				if !strings.Contains(fmt.Sprint(l["error"]), imageFS) {
					t.Errorf("filesystem line does not name the path: %v", l)
				}
			}
			// 1 s, 2 s, 4 s steps: lines at about 0, 1, 3, 7 s.
			if n := len(socketLines); n < 1 || n > 6 {
				t.Errorf("%d lines about the missing socket in %s, want a handful:\n%s", n, window, a.LogTail(40))
			}
			if n := len(fsLines); n < 1 || n > 6 {
				t.Errorf("%d lines about the unmeasured filesystem in %s, want a handful", n, window)
			}
			// Every warning and error of the window: a handful too.
			b, _ := os.ReadFile(a.LogFile)
			problems := strings.Count(string(b), `"level":"warn"`) + strings.Count(string(b), `"level":"error"`)
			t.Logf("%d warnings and errors in all", problems)
			if problems > 20 {
				t.Errorf("%d warnings and errors in %s with containerd away:\n%s", problems, window, a.LogTail(40))
			}
			if last := socketLines[len(socketLines)-1]; fmt.Sprint(last["failures"]) == "1" || last["retry_in_s"] == nil {
				t.Errorf("the last line carries no count or no retry_in_s: %v", last)
			}

			if err := os.MkdirAll(imageFS, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(c.Address, sock); err != nil {
				t.Fatal(err)
			}
			appeared := time.Now()
			natsWaitSynced(t, a)
			t.Logf("synced %s after the socket appeared", time.Since(appeared).Round(time.Millisecond))
			testenv.Eventually(t, 30*time.Second, func() string {
				for _, l := range logLines(t, a, "following containerd") {
					if n, ok := l["failures"].(float64); ok && n >= float64(len(socketLines)) {
						return ""
					}
				}
				return "no \"following containerd\" line with the count of failures"
			})
			testenv.Eventually(t, 30*time.Second, func() string {
				if len(logLines(t, a, "image filesystem measured again")) != 1 {
					return "no \"image filesystem measured again\" line"
				}
				return ""
			})
		})
	}
}

// runTool runs the agent binary with args and GCAGENT_STATE_DIR=stateDir,
// and returns its stdout, stderr, error and how long it took.
func runTool(t *testing.T, stateDir string, args ...string) (string, string, error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.AgentBinary(t), args...)
	cmd.Env = append(os.Environ(), "GCAGENT_STATE_DIR="+stateDir)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	return out.String(), errOut.String(), err, time.Since(start)
}

// TestOperatorMessages: against one local agent with its embedded server,
// `gcagent ctl status` answers in under a second, for a person and with
// --json; a second agent on the same state dir fails naming the first's
// pid; a clean stop ends without a reconnect warning; then ctl and watch,
// with no agent left, fail at once saying no agent answers.
func TestOperatorMessages(t *testing.T) {
	// Not parallel: it asserts `gcagent ctl status` answers in under a second.
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v})
			c.Import(t, testenv.Runnable("docker.io/library/app4:v1", testenv.Layer{Seed: "app4", Size: 64 << 10}))
			state := filepath.Join(t.TempDir(), "state")
			a := testenv.StartAgent(t, c, state, "--keep-image", "app4:*")
			natsWaitSynced(t, a)

			// explain finds the image by the short name the keep pattern matched.
			out, errOut, err, _ := runTool(t, state, "ctl", "--image", "app4:v1", "explain")
			if err != nil || !strings.Contains(out, "app4:v1: keep: kept: docker.io/library/app4:v1 matches --keep-image app4:*") {
				t.Errorf("ctl explain app4:v1: %v\n%s%s", err, out, errOut)
			}
			// A typo is the operator's: no error line in the agent's log.
			if _, _, err, _ := runTool(t, state, "ctl", "--image", "app5:v1", "explain"); err == nil {
				t.Errorf("explain of an unknown image succeeded")
			}
			for _, l := range logLines(t, a, "control request") {
				if l["level"] != "info" {
					t.Errorf("control request logged at %v: %v", l["level"], l)
				}
			}

			// The promise is under 1 s; the median of 3 keeps a noisy
			// machine's one slow start of the binary out of it.
			var took []time.Duration
			for range 3 {
				out, errOut, err, d := runTool(t, state, "ctl", "status")
				if err != nil || !strings.Contains(out, "NODE") || !strings.Contains(out, "test-node") {
					t.Fatalf("ctl status: %v\n%s%s", err, out, errOut)
				}
				took = append(took, d)
			}
			slices.Sort(took)
			t.Logf("ctl status against one local agent: %v (median %s)", took, took[1])
			if took[1] >= time.Second {
				t.Errorf("ctl status took %s (median of %v), promised under 1 s", took[1], took)
			}
			out, errOut, err, _ = runTool(t, state, "ctl", "--json", "status")
			if err != nil || !strings.HasPrefix(out, "{") || !strings.Contains(out, `"ok":true`) {
				t.Errorf("ctl --json status: %v\n%s%s", err, out, errOut)
			}

			// A second agent on the same state dir.
			b := testenv.StartAgent(t, c, state)
			if !b.Exited(60 * time.Second) {
				t.Fatalf("a second agent on the same state dir still runs:\n%s", b.LogTail(20))
			}
			want := fmt.Sprintf("state dir %s is locked by another gcagent (pid %d)", state, a.Pid())
			if !logHas(t, b, want) {
				t.Errorf("second agent's log does not say %q:\n%s", want, b.LogTail(20))
			}

			a.Stop()
			if logHas(t, a, "disconnected from NATS; reconnecting") {
				t.Errorf("a clean stop logged a reconnect warning:\n%s", a.LogTail(15))
			}

			for _, args := range [][]string{{"ctl", "status"}, {"watch", "--json"}} {
				out, errOut, err, d := runTool(t, state, args...)
				t.Logf("%v with no agent: %s in %s", args, strings.TrimSpace(errOut), d.Round(time.Millisecond))
				if err == nil || !strings.Contains(errOut, "no agent answers on nats://") ||
					!strings.Contains(errOut, "is the agent running with --state-dir "+state) {
					t.Errorf("%v with no agent: %v\n%s%s", args, err, out, errOut)
				}
				if d > 10*time.Second {
					t.Errorf("%v with no agent took %s: want it to fail promptly", args, d)
				}
			}
		})
	}
}
