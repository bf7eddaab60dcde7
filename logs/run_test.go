package logs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// startCleaner runs a Cleaner on real directories with the real clock and
// stops it at cleanup.
func startCleaner(t *testing.T, cfg Config, st State) *Cleaner {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	deletes, _ := newDeletes(t, lstatChecker{})
	c, err := New(cfg, st, Options{Deletes: deletes, Metrics: m, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *Cleaner) passes() float64 { return testutil.ToFloat64(c.metrics.passes) }

func TestRunRemovesLinkWhenTargetGoes(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: time.Hour}
	mkdirAll(t, cfg.LogDir)
	mkdirAll(t, cfg.PodLogDir)
	st := newFakeState()
	st.setPod("uid1", fakePod{alive: true})
	st.setPod("uid2", fakePod{alive: true})
	idA, idB := cid("a"), cid("b")
	st.setContainer(idA, false)
	st.setContainer(idB, false)
	c := startCleaner(t, cfg, st)
	eventually(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	// The kubelet's layout: a pod dir with a log, a link to it.
	podA, podB := filepath.Join(cfg.PodLogDir, "ns_a_uid1"), filepath.Join(cfg.PodLogDir, "ns_b_uid2")
	writeFile(t, filepath.Join(podA, "app", "0.log"), "a\n")
	writeFile(t, filepath.Join(podB, "app", "0.log"), "b\n")
	linkA := filepath.Join(cfg.LogDir, "a_ns_app-"+idA+".log")
	linkB := filepath.Join(cfg.LogDir, "b_ns_app-"+idB+".log")
	symlink(t, filepath.Join(podA, "app", "0.log"), linkA)
	symlink(t, filepath.Join(podB, "app", "0.log"), linkB)
	eventually(t, 5*time.Second, "the links' creation seen", func() bool {
		return len(c.Status().Decisions) == 4
	})
	if !exists(linkA) || !exists(linkB) {
		t.Fatal("a link whose target exists was removed")
	}

	// The kubelet removes pod A's log dir: an event in PodLogDir.
	if err := os.RemoveAll(podA); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "dangling link A removed", func() bool { return !exists(linkA) })

	// Pod B's log file goes, deep in its dir, which is not watched: the
	// projection's next change (Notify) brings the pass.
	if err := os.Remove(filepath.Join(podB, "app", "0.log")); err != nil {
		t.Fatal(err)
	}
	c.Notify()
	eventually(t, 5*time.Second, "dangling link B removed after Notify", func() bool { return !exists(linkB) })
	if !exists(podB) {
		t.Error("pod B's dir removed while its pod is alive")
	}
}

func TestRunGraceTimerFires(t *testing.T) {
	base := t.TempDir()
	grace := 300 * time.Millisecond
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: grace}
	mkdirAll(t, cfg.LogDir)
	mkdirAll(t, cfg.PodLogDir)
	st := newFakeState()
	c := startCleaner(t, cfg, st)
	eventually(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	gone := time.Now()
	st.setPod("uid1", fakePod{goneSince: gone})
	pod := filepath.Join(cfg.PodLogDir, "ns_p_uid1")
	writeFile(t, filepath.Join(pod, "app", "0.log"), "x\n")
	eventually(t, 5*time.Second, "pod dir removed by the grace timer", func() bool { return !exists(pod) })
	if elapsed := time.Since(gone); elapsed < grace {
		t.Errorf("removed after %v, before the grace of %v", elapsed, grace)
	}
	// Once the dir is gone nothing is due: a cleaner that waits on its
	// timer makes at most a pass per event of the removal itself (the log,
	// app/ and the pod dir) however long it is left alone; one that loops
	// keeps passing. Counts
	// before the removal depend on how fsnotify batched the writes, so
	// they are not asserted.
	before := c.passes()
	time.Sleep(5 * grace)
	if n := c.passes() - before; n > 3 {
		t.Errorf("%v passes in %v with nothing due: the cleaner loops instead of waiting on a timer", n, 5*grace)
	}
}

func TestRunRearmsRecreatedDir(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: time.Hour}
	mkdirAll(t, cfg.PodLogDir) // LogDir does not exist yet
	st := newFakeState()
	id := cid("c")
	st.setContainer(id, false)
	c := startCleaner(t, cfg, st)
	eventually(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	for round := range 2 {
		mkdirAll(t, cfg.LogDir)
		link := filepath.Join(cfg.LogDir, "p_ns_app-"+id+".log")
		// Created before the watch may be armed: the pass after arming finds
		// it; created after, the event brings a pass.
		symlink(t, filepath.Join(cfg.PodLogDir, "missing.log"), link)
		eventually(t, 10*time.Second, "link removed in the (re)created dir", func() bool { return !exists(link) })
		if round == 0 {
			if err := os.RemoveAll(cfg.LogDir); err != nil {
				t.Fatal(err)
			}
		}
	}
}
