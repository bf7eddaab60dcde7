package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestDryRunSaysSoOutside: an agent run with --dry-run says so wherever an
// operator looks (issue 42 items 5 and 9): its would-remove line has the
// real line's reason (space, not dry-run) and says its bytes are estimated;
// /readyz has a line under its ok; watch's tail says "dry run: would
// remove"; ctl plan and plan say the agent deletes none of it; plan's
// what-if of the high threshold alone is asked of the agent. On d7dd547
// each of these looked like a run.
func TestDryRunSaysSoOutside(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		imgs := c.Import(t, testenv.Runnable("example.test/dry:1", testenv.Layer{Seed: "dry-outside", Size: 512 << 10}))
		digest := imgs[0].Target.Digest.String()
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, "--dry-run", "--image-gc-high-threshold=1", "--image-gc-low-threshold=0",
			"--minimum-image-ttl-duration=1s", "--heartbeat-interval=1s")
		var line map[string]any
		testenv.Eventually(t, 60*time.Second, func() string {
			b, _ := os.ReadFile(a.LogFile)
			for _, l := range strings.Split(string(b), "\n") {
				var m map[string]any
				if json.Unmarshal([]byte(l), &m) == nil && m["message"] == "would remove" && m["digest"] == digest {
					line = m
					return ""
				}
			}
			return "no would-remove line for " + digest
		})
		if line["reason"] != "space" || line["rule"] != "space" || !strings.Contains(line["detail"].(string), "estimated by the image's size") {
			t.Errorf("would-remove line %v, want the removal's reason (space) and the estimate said", line)
		}
		code, body, err := a.GetText("/readyz")
		if err != nil || code != 200 || !strings.HasPrefix(body, "ok\n") || !strings.Contains(body, "dry run: nothing is deleted (--dry-run)") {
			t.Errorf("/readyz %d %v:\n%s", code, err, body)
		}
		testenv.Eventually(t, 30*time.Second, func() string {
			out, err := localTool(t, state, "watch", "--once", "--since", "1h").Output()
			if err != nil || !strings.Contains(string(out), "dry run: would remove (space) est.") {
				return "watch --once does not say the dry run: " + string(out)
			}
			return ""
		})
		out, err := localTool(t, state, "ctl", "plan").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "dry run (--dry-run): the agent deletes none of them") {
			t.Errorf("ctl plan: %v\n%s", err, out)
		}
		plan := func(args ...string) (string, error) {
			cmd := exec.Command(testenv.AgentBinary(t), append([]string{"plan", "--metrics-address", a.Addr,
				"--containerd-address", c.Address, "--state-dir", state, "--namespace", testenv.Namespace}, args...)...)
			b, err := cmd.CombinedOutput()
			return string(b), err
		}
		if out, err := plan(); err != nil || !strings.Contains(out, "DRY RUN: the agent deletes nothing") {
			t.Errorf("plan of the dry-run agent: %v\n%s", err, out)
		}
		// A what-if of the high threshold alone, asked of the agent (its low
		// 0 fits 70 and stays; cmd/gcagent's tests take a default 80 down).
		if out, err := plan("--image-gc-high-threshold=70"); err != nil || !strings.Contains(out, "WHAT IF") {
			t.Errorf("plan --image-gc-high-threshold=70: %v\n%s", err, out)
		}
		if !imageExists(t, c, digest) {
			t.Fatal("the dry run deleted the image")
		}
	})
}

// TestRefusedAgentLeavesNoState: a second agent refused because another
// holds containerd leaves nothing of its start in its state dir (here the
// harness made the dir and writes the agent's log in it), where d7dd547
// had written agent-id.json and state.db there.
func TestRefusedAgentLeavesNoState(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		observe := []string{"--prune-containers=off", "--image-gc-high-threshold=100"}
		first := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "first"), observe...)
		waitHolding(t, first)
		dir := filepath.Join(t.TempDir(), "second")
		second := testenv.StartAgent(t, c, dir, observe...)
		if !second.Exited(60 * time.Second) {
			t.Fatalf("a second agent on the same containerd runs:\n%s", second.LogTail(10))
		}
		if !logHas(t, second, "another gcagent runs on this containerd") {
			t.Fatalf("not refused for the first agent:\n%s", second.LogTail(10))
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			if e.Name() != filepath.Base(second.LogFile) {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Errorf("the refused agent left %v in its new state dir", names)
		}
	})
}
