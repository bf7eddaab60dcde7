package logs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// startCleaner runs a Cleaner on real directories with the real clock and
// stops it at cleanup.
func startCleaner(t *testing.T, cfg Config, st State) *Cleaner {
	t.Helper()
	return startCleanerWith(t, cfg, st, nil)
}

// startCleanerWith is startCleaner with the clock ck (nil: the real one).
func startCleanerWith(t *testing.T, cfg Config, st State, ck clock.Timers) *Cleaner {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	deletes, _ := newDeletes(t, lstatChecker{})
	var wall func() time.Time // with a fake clock, the wall clock moves with it
	if ck != nil {
		wall = wallAlong(ck.Now)
	}
	c, err := New(Deps{State: st, Deletes: deletes}, Options{Config: cfg, Metrics: m, Log: zerolog.New(zerolog.NewTestWriter(t)), Clock: ck, Wall: wall})
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
	wait.Until(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	// The kubelet's layout: a pod dir with a log, a link to it.
	podA, podB := filepath.Join(cfg.PodLogDir, "ns_a_uid1"), filepath.Join(cfg.PodLogDir, "ns_b_uid2")
	writeFile(t, filepath.Join(podA, "app", "0.log"), "a\n")
	writeFile(t, filepath.Join(podB, "app", "0.log"), "b\n")
	linkA := filepath.Join(cfg.LogDir, "a_ns_app-"+idA+".log")
	linkB := filepath.Join(cfg.LogDir, "b_ns_app-"+idB+".log")
	symlink(t, filepath.Join(podA, "app", "0.log"), linkA)
	symlink(t, filepath.Join(podB, "app", "0.log"), linkB)
	wait.Until(t, 5*time.Second, "the links' creation seen", func() bool {
		return len(c.Status().Decisions) == 4
	})
	if !exists(linkA) || !exists(linkB) {
		t.Fatal("a link whose target exists was removed")
	}

	// The kubelet removes pod A's log dir: an event in PodLogDir.
	if err := os.RemoveAll(podA); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 5*time.Second, "dangling link A removed", func() bool { return !exists(linkA) })

	// Pod B's log file goes, deep in its dir, which is not watched: the
	// projection's next change (Notify) brings the pass.
	if err := os.Remove(filepath.Join(podB, "app", "0.log")); err != nil {
		t.Fatal(err)
	}
	c.Notify()
	wait.Until(t, 5*time.Second, "dangling link B removed after Notify", func() bool { return !exists(linkB) })
	if !exists(podB) {
		t.Error("pod B's dir removed while its pod is alive")
	}
}

func TestRunGraceTimerFires(t *testing.T) {
	base := t.TempDir()
	const grace = time.Minute
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: grace}
	mkdirAll(t, cfg.LogDir)
	mkdirAll(t, filepath.Join(cfg.PodLogDir, "ns_live_uid9")) // shows the pod log dir is the watched containerd's
	st := newFakeState()
	st.setPod("uid9", fakePod{alive: true})
	st.setLogDirs(filepath.Join(cfg.PodLogDir, "ns_live_uid9"))
	ck := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := startCleanerWith(t, cfg, st, ck)
	wait.Until(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	gone := ck.Now()
	st.setPod("uid1", fakePod{goneSince: gone})
	pod := filepath.Join(cfg.PodLogDir, "ns_p_uid1")
	agedDir(t, pod, time.Hour, "app/0.log") // its log last written an hour ago
	// The dir's events bring a pass, which keeps it for the grace and arms
	// the timer at its end.
	waitTimer(t, ck, gone.Add(grace))
	if !exists(pod) {
		t.Fatal("pod dir removed before its grace")
	}
	ck.Step(grace)
	wait.Until(t, 5*time.Second, "pod dir removed by the grace timer", func() bool { return !exists(pod) })
	// Once the dir is gone nothing is due: the cleaner waits on its timer
	// for the floor sweep, not a loop.
	waitTimer(t, ck, ck.Now().Add(FloorSweep))
}

// waitTimer waits until the cleaner's timer is armed at want and left so.
func waitTimer(t *testing.T, ck *clock.Fake, want time.Time) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case a := <-ck.Arms():
			if a.At.Equal(want) && len(ck.Arms()) == 0 {
				return
			}
		case <-deadline:
			t.Fatalf("timer not armed at %s", want)
		}
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
	wait.Until(t, 5*time.Second, "first pass", func() bool { return c.passes() >= 1 })

	for round := range 2 {
		mkdirAll(t, cfg.LogDir)
		link := filepath.Join(cfg.LogDir, "p_ns_app-"+id+".log")
		// Created before the watch may be armed: the pass after arming finds
		// it; created after, the event brings a pass.
		mkdirAll(t, filepath.Join(cfg.PodLogDir, "ns_p_uid1", "app"))
		symlink(t, filepath.Join(cfg.PodLogDir, "ns_p_uid1", "app", "missing.log"), link)
		wait.Until(t, 10*time.Second, "link removed in the (re)created dir", func() bool { return !exists(link) })
		if round == 0 {
			if err := os.RemoveAll(cfg.LogDir); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFollowSpacesPassesAskedByChanges: a projection change asks for a
// pass at once; the changes within MinGap after it ask for one more, at
// the gap's end (the agent's debounce, on the injected clock).
func TestFollowSpacesPassesAskedByChanges(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: time.Hour}
	changes := make(chan struct{}, 1)
	ck := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	const gap = 50 * time.Millisecond
	c, err := New(Deps{State: newFakeState(), Changes: changes}, Options{Config: cfg, Clock: ck, MinGap: gap})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.follow(ctx) }()
	defer func() { cancel(); <-done }()
	kicked := func() bool {
		select {
		case <-c.kick:
			return true
		default:
			return false
		}
	}
	changes <- struct{}{}
	wait.Until(t, 5*time.Second, "the first change asks for a pass", kicked)
	waitTimer(t, ck, ck.Now().Add(gap))
	for range 3 {
		select {
		case changes <- struct{}{}:
		default: // one pending change stands for all
		}
	}
	if kicked() {
		t.Fatal("a pass asked for within the gap")
	}
	ck.Step(gap)
	wait.Until(t, 5*time.Second, "the changes within the gap ask for one pass at its end", kicked)
	waitTimer(t, ck, ck.Now().Add(gap))
	if kicked() {
		t.Error("more than one pass for the changes within one gap")
	}
}
