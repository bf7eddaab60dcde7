package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// agentLogHas reports whether a line of the agent's log holds every one of parts.
func agentLogHas(t testing.TB, a *testenv.Agent, parts ...string) bool {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(l, p) }) {
			return true
		}
	}
	return false
}

// imageReport returns the agent's report of the image named name, if any.
func imageReport(t testing.TB, a *testenv.Agent, name string) (projection.ImageReport, bool) {
	t.Helper()
	var rep projection.Report
	if code, err := a.Get("/status", &rep); err != nil || code != 200 {
		return projection.ImageReport{}, false
	}
	for _, img := range rep.Images {
		if slices.Contains(img.Names, name) {
			return img, true
		}
	}
	return projection.ImageReport{}, false
}

// stateFaultNode is the node both state-fault tests start from: a small
// image filesystem under pressure holding the sandbox image, an image a
// running container uses, and job, an unused one; and a NATS server.
func stateFaultNode(t *testing.T, v testenv.Version, job string) (*testenv.Containerd, *server.Server) {
	t.Helper()
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
	ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	c.Import(t,
		testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/keep:1", testenv.Layer{Seed: "keep", Size: 2 << 20}),
		testenv.Runnable(job, testenv.Layer{Seed: "job", Size: 2 << 20}),
	)
	c.RunNative(t, "run-1", "example.test/keep:1", "sleep", "600")
	if u := usagePercent(t, c.Root); u < 2 {
		t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
	}
	return c, ns
}

// TestCorruptStateDB: an agent builds history in its state.db and stops;
// the file is damaged (garbage bytes on one daemon version, truncated to
// half on the other) while a container dies and an unused image arrives.
// The restarted agent moves the file aside unchanged, says so once in its
// log, its metrics and the stream (agent.state_reset), rebuilds the
// projection from containerd (first-seen times start again: that is the
// history lost), and deletes what the policy says and nothing else. A
// third start on the rebuilt file finds nothing to reset.
func TestCorruptStateDB(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c, ns := stateFaultNode(t, v, "example.test/job:1")
		nc := natsConn(t, ns.ClientURL())
		state := filepath.Join(t.TempDir(), "state")
		flags := []string{"--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "0s", "--maximum-dead-containers-per-container", "0"}

		// The first agent only observes: it deletes nothing.
		a := testenv.StartAgent(t, c, state, "--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "100",
			"--prune-containers", "off")
		natsWaitSynced(t, a)
		before, ok := imageReport(t, a, "example.test/keep:1")
		if !ok {
			t.Fatal("first agent: keep:1 not in the projection")
		}
		a.Stop() // a clean stop writes a snapshot: the file holds history

		db := filepath.Join(state, "state.db")
		good, err := os.ReadFile(db)
		if err != nil {
			t.Fatal(err)
		}
		// Truncated in the middle of the pages in use (bbolt's file is
		// longer than what it uses, so half the file could still be whole).
		damaged := good[:usedBytes(t, db)/2/4096*4096]
		if v == testenv.V16 {
			damaged = bytes.Repeat([]byte("not a bbolt file "), len(good)/17)
		}
		if err := os.WriteFile(db, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		// While the agent is down: a container dies, an unused image arrives.
		c.WaitExit(t, c.RunNative(t, "dead-1", "example.test/job:1", "true"))
		c.Import(t, testenv.Runnable("example.test/idle:1", testenv.Layer{Seed: "idle", Size: 2 << 20}))

		restart := time.Now()
		a = testenv.StartAgent(t, c, state, flags...)
		natsWaitSynced(t, a)
		moved, _ := filepath.Glob(db + ".corrupt-*")
		if len(moved) != 1 {
			t.Fatalf("files moved aside: %v, want one", moved)
		}
		if kept, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(kept, damaged) {
			t.Fatalf("%s is not the damaged file byte for byte (%v)", moved[0], err)
		}
		if !agentLogHas(t, a, `"level":"error"`, "state file unreadable", filepath.Base(moved[0]), "LRU history") {
			t.Errorf("no error log line naming %s and the lost history", moved[0])
		}
		// Policy as usual on the rebuilt projection: the dead container and
		// every unused image go, the running container and its image stay.
		testenv.Eventually(t, 60*time.Second, func() string {
			switch {
			case !containerGone(t, c, "dead-1"):
				return "dead-1 not removed"
			case !imageGone(t, c, "example.test/idle:1"):
				return "idle:1 not removed"
			case !imageGone(t, c, "example.test/job:1"):
				return "job:1 not removed"
			}
			return ""
		})
		if containerGone(t, c, "run-1") || imageGone(t, c, "example.test/keep:1") || imageGone(t, c, c.SandboxImage) {
			t.Fatal("a running container, its image or the sandbox image was deleted")
		}
		converge(t, c, a)
		after, ok := imageReport(t, a, "example.test/keep:1")
		if !ok || after.FirstSeen.Before(restart) || !before.FirstSeen.Before(restart) {
			t.Errorf("keep:1 first seen %v before the reset, %v after (restart at %v): want history restarted", before.FirstSeen, after.FirstSeen, restart)
		}
		m, err := metricsText(a)
		if err != nil {
			t.Fatal(err)
		}
		if n := metricSum(m, "gcagent_state_resets_total"); n != 1 {
			t.Errorf("gcagent_state_resets_total %v, want 1", n)
		}
		var resets []storedEvent
		testenv.Eventually(t, 30*time.Second, func() string {
			resets = nil
			for _, ev := range readStream(t, nc) {
				if ev.KindAction == "agent.state_reset" {
					resets = append(resets, ev)
				}
			}
			if len(resets) == 0 {
				return "no agent.state_reset in the stream"
			}
			return ""
		})
		var data struct{ Path, MovedTo, Error, Lost string }
		if err := json.Unmarshal(resets[0].Data, &data); err != nil || len(resets) != 1 || data.MovedTo != moved[0] || data.Path != db ||
			data.Error == "" || data.Lost == "" {
			t.Errorf("%d agent.state_reset events, data %s (%v)", len(resets), resets[0].Data, err)
		}
		t.Logf("agent.state_reset: moved to %s: %s", filepath.Base(data.MovedTo), data.Error)
		checkContract(t, readStream(t, nc))

		// The rebuilt file is good: the next start restores it, no reset.
		a.Stop()
		a = testenv.StartAgent(t, c, state, flags...)
		natsWaitSynced(t, a)
		if moved2, _ := filepath.Glob(db + ".corrupt-*"); len(moved2) != 1 {
			t.Errorf("after a clean restart, files moved aside: %v", moved2)
		}
		if m, err := metricsText(a); err != nil || metricSum(m, "gcagent_state_resets_total") != 0 {
			t.Errorf("third start: resets %v (%v)", metricSum(m, "gcagent_state_resets_total"), err)
		}
		if again, ok := imageReport(t, a, "example.test/keep:1"); !ok || !again.FirstSeen.Equal(after.FirstSeen) {
			t.Errorf("third start: keep:1 first seen %v, want %v restored", again.FirstSeen, after.FirstSeen)
		}
	})
}

// usedBytes is the size of the pages a bbolt file uses (its meta page's
// high water mark), read with bbolt itself.
func usedBytes(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int64
	if err := db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// fillDir writes a file into dir until the filesystem has no space left
// and returns its path.
func fillDir(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "fill")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", dir, err)
				}
				break
			}
		}
	}
	return path
}

// TestStateDiskFull runs the agent with its state dir on a small tmpfs and
// fills it. GC goes on (a dead container and an unused image are removed)
// while the journal fails; /readyz names the journal error and the failures
// are counted. When space returns, a retry persists everything without
// waiting for an event: a kill -9 after that loses nothing, not even the
// first-seen time of an image that arrived while the disk was full.
func TestStateDiskFull(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c, ns := stateFaultNode(t, v, "keep.test/job:1")
		state := filepath.Join(t.TempDir(), "state")
		if err := os.MkdirAll(state, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=4m"); err != nil {
			t.Fatalf("mount tmpfs on %s: %v", state, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(state, unix.MNT_DETACH) }) // after the agent is killed
		// The agent's log goes to another dir (StartAgent's first dir); the
		// later --state-dir wins.
		logs := t.TempDir()
		flags := []string{"--state-dir", state, "--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "1",
			"--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s", "--keep-image", "keep.test/*",
			"--maximum-dead-containers-per-container", "0"}
		a := testenv.StartAgent(t, c, logs, flags...)
		natsWaitSynced(t, a)
		if _, err := os.Stat(filepath.Join(state, "state.db")); err != nil {
			t.Fatalf("state.db not on the tmpfs: %v", err)
		}

		fill := fillDir(t, state)
		var st unix.Statfs_t
		if err := unix.Statfs(state, &st); err != nil || st.Bavail != 0 {
			t.Fatalf("state dir not full: %d blocks available (%v)", st.Bavail, err)
		}
		// While the state disk is full: a container dies, an unused image
		// and a kept one arrive (pulled under a lease: the agent, with no
		// minimum age, may delete the unused one as soon as it is whole).
		c.WaitExit(t, c.RunNative(t, "dead-full", "keep.test/job:1", "true"))
		c.ImportLeased(t,
			testenv.Runnable("example.test/idle:1", testenv.Layer{Seed: "idle", Size: 2 << 20}),
			testenv.Runnable("keep.test/during:1", testenv.Layer{Seed: "during", Size: 1 << 20}),
		)
		testenv.Eventually(t, 60*time.Second, func() string {
			switch {
			case !containerGone(t, c, "dead-full"):
				return "dead-full not removed while the state disk is full"
			case !imageGone(t, c, "example.test/idle:1"):
				return "idle:1 not removed while the state disk is full"
			}
			return ""
		})
		var body string
		testenv.Eventually(t, 30*time.Second, func() string {
			code, b, err := readyz(a)
			body = b
			if err != nil || code != 200 || !strings.Contains(b, "journal:") || !strings.Contains(b, "no space left on device") {
				return fmt.Sprintf("readyz %d %v: %q, want 200 with the journal error", code, err, b)
			}
			return ""
		})
		t.Logf("readyz while full: %s", strings.TrimSpace(body))
		m, err := metricsText(a)
		if err != nil {
			t.Fatal(err)
		}
		if n := metricSum(m, "gcagent_projection_journal_errors_total"); n < 1 {
			t.Errorf("gcagent_projection_journal_errors_total %v while the journal fails", n)
		}
		during, ok := imageReport(t, a, "keep.test/during:1")
		if !ok || during.FirstSeen.IsZero() {
			t.Fatal("keep.test/during:1 not in the projection")
		}

		// Space returns: with nothing happening on the node, the agent's
		// retry writes a snapshot that covers the gap.
		if err := os.Remove(fill); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() string {
			if code, b, err := readyz(a); err != nil || code != 200 || strings.Contains(b, "journal:") {
				return fmt.Sprintf("readyz %d %v: %q, want the journal error gone", code, err, b)
			}
			return ""
		})
		if !agentLogHas(t, a, "journal resumed") {
			t.Error("no log line says the journal resumed")
		}
		c.WaitExit(t, c.RunNative(t, "dead-after", "keep.test/job:1", "true"))
		waitRemoved(t, c, "dead-after")
		a.Kill() // no final snapshot: what is restored was written when space returned
		a = testenv.StartAgent(t, c, logs, flags...)
		natsWaitSynced(t, a)
		if got, ok := imageReport(t, a, "keep.test/during:1"); !ok || !got.FirstSeen.Equal(during.FirstSeen) {
			t.Errorf("after kill -9: keep.test/during:1 first seen %v, want %v (written when space returned)", got.FirstSeen, during.FirstSeen)
		}
		if containerGone(t, c, "run-1") || imageGone(t, c, "example.test/keep:1") || imageGone(t, c, "keep.test/during:1") {
			t.Fatal("a running container, its image or a kept image was deleted")
		}
		converge(t, c, a)
	})
}
