package e2e

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

const maxQueuedEvents = "/proc/sys/fs/inotify/max_queued_events"

// TestLogsInotifyOverflow: the agent's inotify queue is made tiny (the
// kernel reads fs.inotify.max_queued_events when the agent creates its
// watcher; it is restored right after), then a burst of dangling links
// overflows it while the agent is frozen. The agent says so and rescans in full: every link goes.
func TestLogsInotifyOverflow(t *testing.T) {
	// Not parallel: it sets fs.inotify.max_queued_events, which every inotify
	// instance created meanwhile reads, other tests' agents included.
	if os.Geteuid() != 0 {
		testenv.Require(t, false, "root (to set fs.inotify.max_queued_events)")
	}
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	// Another test process doing the same meanwhile would read 16 as the
	// value to restore.
	testenv.Exclusive(t, "sysctl-inotify", 10*time.Minute)
	old, err := os.ReadFile(maxQueuedEvents)
	if err != nil {
		t.Fatal(err)
	}
	restore := func() { _ = os.WriteFile(maxQueuedEvents, old, 0o644) }
	t.Cleanup(restore)
	if err := os.WriteFile(maxQueuedEvents, []byte("16"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodePod(t, c) // the pod log dir is the watched containerd's
	a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--prune-containers=off", "--pod-log-grace=1s")
	testenv.Eventually(t, 30*time.Second, func() string {
		b, _ := os.ReadFile(a.LogFile)
		if !strings.Contains(string(b), `"path":"`+c.LogDir+`"`) {
			return "agent not watching " + c.LogDir + " yet"
		}
		return ""
	})
	restore() // only the agent's watcher has the tiny queue
	waitSynced(t, a)

	// The links' targets go missing from a directory the agent sees (a
	// target in a directory never seen is no sign that it is gone).
	if err := os.MkdirAll(filepath.Join(c.PodLogDir, "gone"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Frozen, the agent reads nothing: the kernel queue of 16 overflows
	// for certain, however fast the agent would have drained it.
	a.Freeze()
	const n = 300
	var links []string
	for i := range n {
		id := fmt.Sprintf("%x", sha256.Sum256([]byte(fmt.Sprint("overflow", i))))
		link := filepath.Join(c.LogDir, fmt.Sprintf("burst_default_c-%s.log", id))
		if err := os.Symlink(filepath.Join(c.PodLogDir, "gone", id+".log"), link); err != nil {
			t.Fatal(err)
		}
		links = append(links, link)
	}
	a.Thaw()
	testenv.Eventually(t, time.Minute, func() string {
		left := 0
		for _, l := range links {
			if _, err := os.Lstat(l); err == nil {
				left++
			}
		}
		if left > 0 {
			return fmt.Sprintf("%d of %d dangling links left", left, n)
		}
		return ""
	})
	b, _ := os.ReadFile(a.LogFile)
	if !strings.Contains(string(b), "watcher overflow, full rescan") {
		t.Errorf("no overflow reported: the burst did not overflow the queue of 16, so this test proves nothing")
	}
}
