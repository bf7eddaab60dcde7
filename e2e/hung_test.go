package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestHungContainerd: containerd frozen with SIGSTOP for 30 s while a dead
// container waits for its removal: the agent stays alive (/healthz), /readyz
// fails naming containerd within seconds, and once containerd answers again
// /readyz recovers by itself and the container goes; a new one goes too.
// Then containerd restarts while a removal is due: the agent reconnects and
// the container goes.
func TestHungContainerd(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		l := recordLifecycle(t, c)
		c.Import(t, testenv.Runnable(gcImage))
		l.waitActive(t)
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--uncollected-exit-grace=2s")
		waitSynced(t, a)
		testenv.Eventually(t, 30*time.Second, func() string {
			if code, body, _ := readyz(a); code != http.StatusOK {
				return fmt.Sprintf("readyz %d %s", code, body)
			}
			return ""
		})

		ctr := c.RunNative(t, "hung-a", gcImage, "true")
		c.WaitExit(t, ctr) // its removal falls due 2 s later, while containerd is frozen
		c.Freeze()
		frozen := time.Now()
		testenv.Eventually(t, 20*time.Second, func() string {
			code, body, _ := readyz(a)
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "containerd") {
				return fmt.Sprintf("readyz %d %q while containerd is frozen", code, body)
			}
			return ""
		})
		for time.Since(frozen) < 30*time.Second {
			if code, err := a.Get("/healthz", nil); err != nil || code != http.StatusOK {
				t.Fatalf("agent not alive while containerd is frozen: %d %v", code, err)
			}
			time.Sleep(time.Second)
		}
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
