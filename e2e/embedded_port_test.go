package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/testenv"
)

// TestEmbeddedPortTakenImageGCAtOnce: the default install (its embedded
// NATS server, the default --keep-list-wait of 5m) on a node where the
// server's address is taken, with the disk over the high threshold. The
// server runs in process anyway and the fleet keep list is known from the
// agent's own store (none: the store is new), so the first image delete
// comes within seconds of the start; nothing waits for the list.
// /readyz, one log line (however many binds failed) and `gcagent check`
// name the address and the error. On d7dd547 the server did not start,
// the list stayed unknown, every image was kept as keep-list-unread for
// 5 minutes, and check said OK "read from the embedded server at start".
func TestEmbeddedPortTakenImageGCAtOnce(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "port-taken-filler", Size: 3 << 20}}}
		c.Import(t, filler)
		if u := usagePercent(t, c.Root); u < 2 {
			t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
		}
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		addr := busy.Addr().String()
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, "--embedded-nats-listen", addr,
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s")
		testenv.Eventually(t, 60*time.Second, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image is still there: " + keptBy(a, filler.Name)
			}
			return ""
		})
		var started, removed time.Time
		testenv.Eventually(t, 10*time.Second, func() string {
			started = firstLogged(t, a, "gcagent starting", nil)
			removed = firstLogged(t, a, "image removed", map[string]string{"image": filler.Name})
			if started.IsZero() || removed.IsZero() {
				return fmt.Sprintf("log lines: starting %s, removed %s", started, removed)
			}
			return ""
		})
		t.Logf("%s: first image removed %s after the start, with the NATS address taken", v, removed.Sub(started).Round(time.Millisecond))
		if d := removed.Sub(started); d > 30*time.Second {
			t.Errorf("first image removed %s after the start: image GC waited", d)
		}
		if !firstLogged(t, a, "no fleet keep list saved: image deletes by threshold or maximum age wait", nil).IsZero() {
			t.Errorf("image deletes waited for the fleet keep list:\n%s", a.LogTail(40))
		}
		testenv.Eventually(t, 30*time.Second, func() string {
			m := mustMetrics(t, a)
			if metricSum(m, "gcagent_natsbus_embedded_up") != 1 || metricSum(m, "gcagent_natsbus_embedded_listening") != 0 ||
				metricSum(m, "gcagent_natsbus_embedded_listen_failures_total") < 2 ||
				metricSum(m, "gcagent_keep_list_waiting") != 0 || metricSum(m, `gcagent_keep_list_state{state="known"}`) != 1 {
				return "metrics:\n" + grepLines(m, "gcagent_natsbus_embedded") + grepLines(m, "gcagent_keep_list")
			}
			return ""
		})
		code, body, err := readyz(a)
		if err != nil || code != 200 || !strings.Contains(body, "nats: embedded NATS server cannot listen on "+addr) ||
			!strings.Contains(body, "address already in use") || strings.Contains(body, "\nfleet keep list: ") {
			t.Errorf("/readyz %d %v:\n%s", code, err, body)
		}
		logb, err := os.ReadFile(a.LogFile)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(logb), "embedded NATS server cannot listen on its client address"); n != 1 {
			t.Errorf("%d log lines for the bind failures, want 1:\n%s", n, a.LogTail(40))
		}

		// check, as an operator runs it on the node, says what happened.
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(testenv.AgentBinary(t), "check", "--json", "--containerd-address", c.Address,
			"--state-dir", state, "--metrics-address", a.Addr, "--embedded-nats-listen", addr,
			"--image-fs", c.Root, "--log-dir", c.LogDir, "--pod-log-dir", c.PodLogDir, "--node-name", "test-node")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run() // other lines may fail on this test node: only nats matters
		var res []agent.CheckResult
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("check --json: %v\n%s\nstderr %s", err, stdout.String(), stderr.String())
		}
		found := false
		for _, r := range res {
			if r.Name != "nats" {
				continue
			}
			found = true
			t.Logf("check: %s nats: %s", r.Status, r.Detail)
			if r.Status != agent.CheckWarn || !strings.Contains(r.Detail, "cannot listen on "+addr) ||
				!strings.Contains(r.Detail, "address already in use") || !strings.Contains(r.Detail, "fleet keep list: known") {
				t.Errorf("check nats %s %q: want WARN naming %s, the error, and the keep list known", r.Status, r.Detail, addr)
			}
		}
		if !found {
			t.Errorf("no nats line in %s", stdout.String())
		}
	})
}
