package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/gcagent/gcagent/internal/testenv"
)

// pruneBenchItems is how many containers and how many log links each
// latency is measured over.
const pruneBenchItems = 120

// kubeletPeriod is the kubelet's structural delay: container GC and the
// dead-symlink sweep run on a 1-minute tick.
const kubeletPeriod = time.Minute

// benchWorkers is how many containers the benchmark starts at once
// (BENCH_WORKERS, default 4): exits come in bursts, as on a busy node.
var benchWorkers = func() int {
	var n int
	if _, err := fmt.Sscan(os.Getenv("BENCH_WORKERS"), &n); err == nil && n > 0 {
		return n
	}
	return 4
}()

// pruneQuantile returns the p-th percentile (nearest rank) of ds.
func pruneQuantile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// pruneParallel runs fn(i) for i in [0, n) on w workers.
func pruneParallel(n, w int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// BenchmarkPruneLatency measures, against a real containerd and the real
// agent, (1) how long after a target's removal the agent removes the
// dangling log link, and (2) how long after a plain container's exit
// (containerd's exited_at) containerd deletes it on the agent's behalf with
// TTL 0, each as p50 and p99 over pruneBenchItems items, beside the
// kubelet's structural 60 s. Run with -benchtime=1x: one run is the
// workload.
func BenchmarkPruneLatency(b *testing.B) {
	for _, v := range testenv.Versions() {
		b.Run("containerd-"+string(v), func(b *testing.B) {
			for range b.N {
				benchPrune(b, v)
			}
		})
	}
}

func benchPrune(b *testing.B, v testenv.Version) {
	c := testenv.StartContainerd(b, testenv.Options{Version: v})
	l := recordLifecycle(b, c)
	c.Import(b, testenv.Runnable(gcImage))
	l.waitActive(b)

	// Logs: exited containers, each with a kubelet-style pod dir and link.
	ids := make([]string, pruneBenchItems)
	pruneParallel(pruneBenchItems, 4, func(i int) {
		ids[i] = fmt.Sprintf("logc%08d", i)
		c.WaitExit(b, c.RunNative(b, ids[i], gcImage, "true"))
	})
	links := map[string]int{}
	podDirs := make([]string, pruneBenchItems)
	for i, id := range ids {
		podDirs[i] = filepath.Join(c.PodLogDir, fmt.Sprintf("default_bench%d_%08x-uid", i, i))
		target := filepath.Join(podDirs[i], "c", "0.log")
		mustWrite(b, target, "log line\n")
		name := fmt.Sprintf("bench%d_default_c-%s.log", i, id)
		mustSymlink(b, target, filepath.Join(c.LogDir, name))
		links[name] = i
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(c.LogDir); err != nil {
		b.Fatal(err)
	}
	gone := make(chan int, pruneBenchItems)
	go func() {
		for ev := range w.Events {
			if i, ok := links[filepath.Base(ev.Name)]; ok && ev.Has(fsnotify.Remove) {
				gone <- i
			}
		}
	}()
	a := testenv.StartAgent(b, c, filepath.Join(b.TempDir(), "state-logs"), "--prune-containers=off", "--pod-log-grace=1h")
	waitSynced(b, a)
	b.ResetTimer()
	logLat := make([]time.Duration, 0, pruneBenchItems)
	for i, dir := range podDirs {
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		removed := time.Now()
		select {
		case got := <-gone:
			if got != i {
				b.Fatalf("link %d removed while waiting for %d", got, i)
			}
			logLat = append(logLat, time.Since(removed))
		case <-time.After(10 * time.Second):
			b.Fatalf("link %d not removed 10s after its target:\n%s", i, a.LogTail(20))
		}
	}
	b.StopTimer()
	a.Stop()

	// Containers: TTL 0. The agent first clears the exited containers above
	// (not measured), then follows new ones: half are collected by their
	// client (task deleted after the exit, as ctr run does), half are not.
	const grace = time.Second
	a = testenv.StartAgent(b, c, filepath.Join(b.TempDir(), "state-ctrs"), "--uncollected-exit-grace="+grace.String())
	waitSynced(b, a)
	testenv.Eventually(b, time.Minute, func() string {
		for _, id := range ids {
			if _, del := l.times(id); del.IsZero() {
				return "backlog not cleared: " + id
			}
		}
		return ""
	})
	b.StartTimer()
	cids := make([]string, pruneBenchItems)
	pruneParallel(pruneBenchItems, benchWorkers, func(i int) {
		cids[i] = fmt.Sprintf("benchc%08d", i)
		ctr := c.RunNative(b, cids[i], gcImage, "true")
		if i%2 == 0 {
			c.WaitExit(b, ctr)
			task, err := ctr.Task(c.Ctx(), nil)
			if err == nil {
				_, _ = task.Delete(c.Ctx()) // the client collects; a NotFound means the agent was first
			}
		}
	})
	var ctrLat, collLat []time.Duration
	testenv.Eventually(b, time.Minute, func() string {
		ctrLat, collLat = ctrLat[:0], collLat[:0]
		for i, id := range cids {
			ex, del := l.times(id)
			if ex.IsZero() || del.IsZero() {
				return id + " not removed yet"
			}
			if i%2 == 0 {
				l.mu.Lock()
				coll := l.collected[id]
				l.mu.Unlock()
				if !coll.IsZero() {
					collLat = append(collLat, del.Sub(coll))
				}
				continue
			}
			ctrLat = append(ctrLat, del.Sub(ex.Add(grace)))
		}
		return ""
	})
	b.StopTimer()

	b.ReportMetric(float64(pruneQuantile(ctrLat, 50).Microseconds())/1000, "uncollected-p50-ms")
	b.ReportMetric(float64(pruneQuantile(ctrLat, 99).Microseconds())/1000, "uncollected-p99-ms")
	if len(collLat) > 0 {
		b.ReportMetric(float64(pruneQuantile(collLat, 50).Microseconds())/1000, "collected-p50-ms")
		b.ReportMetric(float64(pruneQuantile(collLat, 99).Microseconds())/1000, "collected-p99-ms")
	}
	b.ReportMetric(float64(pruneQuantile(logLat, 50).Microseconds())/1000, "log-p50-ms")
	b.ReportMetric(float64(pruneQuantile(logLat, 99).Microseconds())/1000, "log-p99-ms")
	b.ReportMetric(kubeletPeriod.Seconds(), "kubelet-period-s")
	b.Logf("containerd %s, %d items each: plain container owner done->removal: collected (client task delete) p50 %s p99 %s (%d), uncollected (exit+%s grace) p50 %s p99 %s max %s; target->link removal p50 %s p99 %s max %s; kubelet: up to %s",
		v, pruneBenchItems, pruneQuantile(collLat, 50), pruneQuantile(collLat, 99), len(collLat), grace,
		pruneQuantile(ctrLat, 50), pruneQuantile(ctrLat, 99), slices.Max(ctrLat),
		pruneQuantile(logLat, 50), pruneQuantile(logLat, 99), slices.Max(logLat), kubeletPeriod)
}
