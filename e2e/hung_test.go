package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// TestHungContainerd: containerd frozen with SIGSTOP while a dead container
// the agent has seen exit waits for its removal, for two call timeouts (the agent's calls time out
// after testenv.ShortCallTimeout, 5 s, a test build's hook, instead of
// node.CallTimeout, 30 s), and until the removal's call has timed out:
// the agent stays alive (/healthz), /readyz fails naming containerd within
// seconds, and once containerd answers again /readyz recovers by itself
// and the container goes; a new one goes too. Then containerd restarts
// while a removal is due: the agent reconnects and the container goes.
func TestHungContainerd(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		l := recordLifecycle(t, c)
		c.Import(t, testenv.Runnable(gcImage))
		l.waitActive(t)
		a := testenv.StartAgentEnv(t, c, filepath.Join(t.TempDir(), "state"), testenv.ShortCallTimeoutEnv(), "--uncollected-exit-grace=5s")
		waitSynced(t, a)
		testenv.Eventually(t, 30*time.Second, func() string {
			if code, body, _ := readyz(a); code != http.StatusOK {
				return fmt.Sprintf("readyz %d %s", code, body)
			}
			return ""
		})

		ctr := c.RunNative(t, "hung-a", gcImage, "true")
		c.WaitExit(t, ctr) // its removal falls due 5 s later, while containerd is frozen
		testenv.Eventually(t, 5*time.Second, func() string {
			var rep projection.Report
			if code, err := a.Get("/status", &rep); err != nil || code != http.StatusOK {
				return fmt.Sprintf("status: %d %v", code, err)
			}
			for _, ctr := range rep.Containers {
				if ctr.ID == "hung-a" && ctr.ExitedAt != nil {
					return ""
				}
			}
			return "the agent has not seen hung-a exit"
		})
		c.Freeze()
		frozen := time.Now()
		if _, del := l.times("hung-a"); !del.IsZero() {
			t.Fatalf("test setup: hung-a removed before containerd was frozen (over 5 s after its exit)")
		}
		testenv.Eventually(t, 20*time.Second, func() string {
			code, body, _ := readyz(a)
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "containerd") {
				return fmt.Sprintf("readyz %d %q while containerd is frozen", code, body)
			}
			return ""
		})
		// The hang: at least two call timeouts, and until the removal's call
		// has timed out; the agent alive all along (asked every second).
		testenv.EventuallyEvery(t, time.Minute, time.Second, func() string {
			if code, err := a.Get("/healthz", nil); err != nil || code != http.StatusOK {
				t.Fatalf("agent not alive while containerd is frozen: %d %v", code, err)
			}
			if time.Since(frozen) < 2*testenv.ShortCallTimeout {
				return "frozen for less than two call timeouts"
			}
			if len(logContaining(t, a, "hung-a", "deadline exceeded")) == 0 {
				return "no call about hung-a timed out yet"
			}
			return ""
		})
		t.Logf("containerd frozen for %s", time.Since(frozen).Round(time.Millisecond))
		c.Thaw()
		thawed := time.Now()
		testenv.Eventually(t, time.Minute, func() string {
			if code, body, _ := readyz(a); code != http.StatusOK {
				return fmt.Sprintf("readyz %d %q after containerd answers again", code, body)
			}
			return ""
		})
		t.Logf("ready again %s after containerd was thawed", time.Since(thawed).Round(time.Millisecond))
		c.RunNative(t, "hung-b", gcImage, "true")
		testenv.Eventually(t, time.Minute, func() string {
			for _, id := range []string{"hung-a", "hung-b"} {
				if _, del := l.times(id); del.IsZero() {
					return id + " not removed"
				}
			}
			return ""
		})

		// Restarted while a removal is due: the agent reconnects, relists,
		// and the container goes (a 2.x daemon may reap it on restart
		// itself; either way it is gone and the agent is ready again).
		ctr = c.RunNative(t, "restart-a", gcImage, "true")
		c.WaitExit(t, ctr)
		c.Restart()
		testenv.Eventually(t, time.Minute, func() string {
			if nativeExists(t, c, "restart-a") {
				return "restart-a still there after containerd restarted"
			}
			if code, body, _ := readyz(a); code != http.StatusOK {
				return fmt.Sprintf("readyz %d %q after containerd restarted", code, body)
			}
			return ""
		})
	})
}

// logContaining returns the agent's log lines that hold every one of subs.
func logContaining(t *testing.T, a *testenv.Agent, subs ...string) []string {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(l, s) }) {
			out = append(out, l)
		}
	}
	return out
}
