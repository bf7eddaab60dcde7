package e2e

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// notifySocket is a NOTIFY_SOCKET that records what it receives, like
// systemd's end of sd_notify.
type notifySocket struct {
	Path string
	mu   sync.Mutex
	msgs []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	ns := &notifySocket{Path: filepath.Join(t.TempDir(), "notify.sock")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: ns.Path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			ns.mu.Lock()
			ns.msgs = append(ns.msgs, string(buf[:n]))
			ns.mu.Unlock()
		}
	}()
	return ns
}

func (n *notifySocket) count(prefix string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, m := range n.msgs {
		if strings.HasPrefix(m, prefix) {
			c++
		}
	}
	return c
}

// TestSystemdNotify runs the agent binary as systemd would with Type=notify
// and WatchdogSec: while containerd is down the agent serves, is not ready
// and sends no READY=1, but feeds the watchdog (its loop is healthy); once
// containerd is up, READY=1 comes, and the projection is synced when it
// does; the watchdog keeps being fed; SIGTERM sends STOPPING=1.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		c.Stop() // containerd is "not up yet"
		ns := listenNotify(t)
		const watchdog = 400 * time.Millisecond
		// Only the agent has them: containerd, started below, would send
		// its own READY=1 to the same socket (and so would any process
		// another test starts meanwhile, were they in the test's own
		// environment).
		a := testenv.StartAgentEnv(t, c, filepath.Join(t.TempDir(), "state"),
			[]string{"NOTIFY_SOCKET=" + ns.Path, "WATCHDOG_USEC=" + fmt.Sprint(watchdog.Microseconds())})
		testenv.Eventually(t, 30*time.Second, func() string {
			if code, err := a.Get("/healthz", nil); code != 200 {
				return fmt.Sprintf("agent not serving: %d %v", code, err)
			}
			return ""
		})
		// Observed, not slept: three pings while containerd is down.
		testenv.Eventually(t, 30*time.Second, func() string {
			if n := ns.count("WATCHDOG=1"); n < 3 {
				return fmt.Sprintf("%d watchdog pings while containerd is down", n)
			}
			return ""
		})
		if code, _ := a.Get("/readyz", nil); code == 200 {
			t.Fatal("agent ready while containerd is down")
		}
		if n := ns.count("READY=1"); n != 0 {
			t.Fatalf("READY=1 sent while containerd is down (projection not synced)")
		}

		c.Restart()
		testenv.Eventually(t, 30*time.Second, func() string {
			if ns.count("READY=1") == 0 {
				return "no READY=1 after containerd came up"
			}
			return ""
		})
		var rep struct {
			Synced bool `json:"synced"`
		}
		if code, err := a.Get("/status", &rep); code != 200 || err != nil || !rep.Synced {
			t.Errorf("READY=1 received but the projection is not synced (%d %v)", code, err)
		}
		pings := ns.count("WATCHDOG=1")
		testenv.Eventually(t, 30*time.Second, func() string {
			if n := ns.count("WATCHDOG=1"); n < pings+3 {
				return fmt.Sprintf("%d watchdog pings after ready", n-pings)
			}
			return ""
		})
		a.Stop()
		if ns.count("STOPPING=1") != 1 || ns.count("READY=1") != 1 {
			ns.mu.Lock()
			t.Errorf("notifications: %q", ns.msgs)
			ns.mu.Unlock()
		}
	})
}
