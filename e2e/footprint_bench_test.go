package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// footprintChurn is how many containers BenchmarkFootprint creates and
// deletes (two containerd events each) while the agent follows.
const footprintChurn = 2000

// footprintSizes are the node sizes (images and containers each) measured:
// FOOTPRINT_SIZES as a comma-separated list, default 1000 and 10000.
func footprintSizes(b *testing.B) []int {
	v := os.Getenv("FOOTPRINT_SIZES")
	if v == "" {
		return []int{1000, 10000}
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			b.Fatalf("FOOTPRINT_SIZES=%q: %q is not a positive count", v, s)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkFootprint measures the agent binary at the size of a busy node
// (issue #11): a private containerd (the newest of testenv.Versions())
// seeded with n images and n containers, half of them labelled like CRI
// containers, and the agent at its defaults (log level info). It reports
//   - ready-first-ms: process start to the first /readyz 200, empty state;
//   - ready-restart-ms: after SIGTERM, start on the same state dir to 200;
//   - rss-MiB, peak-MiB: VmRSS at the first ready, VmHWM at the end of the
//     first run (after the churn); restart-rss-MiB likewise after restart;
//   - cpu-ms/event: the agent's utime+stime while footprintChurn containers
//     are created and deleted through the container service, until all
//     their events are applied, per containerd event (idle included; the
//     idle rate is logged).
//
// One run is the workload: run with -benchtime=1x.
func BenchmarkFootprint(b *testing.B) {
	vs := testenv.Versions()
	v := vs[len(vs)-1]
	for _, n := range footprintSizes(b) {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for range b.N {
				benchFootprint(b, v, n)
			}
		})
	}
}

// footprintMetric returns the value of one series (name with its labels, as
// /metrics spells it) in a /metrics text, 0 if absent.
func footprintMetric(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, series); ok && strings.HasPrefix(rest, " ") {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v
			}
		}
	}
	return 0
}

// waitReady polls /readyz every 10ms from start and returns the time to the
// first 200.
func waitReady(b *testing.B, a *testenv.Agent, start time.Time) time.Duration {
	b.Helper()
	deadline := start.Add(3 * time.Minute)
	for {
		if code, _ := a.Get("/readyz", nil); code == 200 {
			return time.Since(start)
		}
		if a.Exited(0) {
			b.Fatalf("agent exited before ready:\n%s", a.LogTail(30))
		}
		if time.Now().After(deadline) {
			b.Fatalf("agent not ready after %s:\n%s", time.Since(start), a.LogTail(30))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustMemory(b *testing.B, a *testenv.Agent) testenv.ProcMemory {
	b.Helper()
	m, err := testenv.ReadProcMemory(a.Pid())
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func mustCPU(b *testing.B, a *testenv.Agent) time.Duration {
	b.Helper()
	d, err := testenv.ReadProcCPU(a.Pid())
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func mustMetricsText(b *testing.B, a *testenv.Agent) string {
	b.Helper()
	text, err := metricsText(a)
	if err != nil {
		b.Fatal(err)
	}
	return text
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func benchFootprint(b *testing.B, v testenv.Version, n int) {
	c := testenv.StartContainerd(b, testenv.Options{Version: v})
	seed := testenv.Seed{Images: n, Containers: n}
	began := time.Now()
	c.SeedRecords(b, seed)
	seeding := time.Since(began)
	state := filepath.Join(b.TempDir(), "state")
	flags := []string{"--log-level=info"}
	testenv.AgentBinary(b) // built before the clock starts

	// 1. First start, empty state dir.
	b.ResetTimer()
	start := time.Now()
	a := testenv.StartAgent(b, c, state, flags...)
	readyFirst := waitReady(b, a, start)
	memFirst := mustMemory(b, a)
	text := mustMetricsText(b, a)
	if got := footprintMetric(text, "gcagent_projection_images"); int(got) != n {
		b.Fatalf("ready with %v images in the projection, want %d", got, n)
	}
	if got := metricSum(text, "gcagent_projection_containers"); int(got) != n {
		b.Fatalf("ready with %v containers in the projection, want %d", got, n)
	}
	heapInuse := footprintMetric(text, "go_memstats_heap_inuse_bytes")
	heapAlloc := footprintMetric(text, "go_memstats_heap_alloc_bytes")
	goSys := footprintMetric(text, "go_memstats_sys_bytes")

	// 2. Idle rate, then churn: create and delete footprintChurn containers
	// (half CRI-labelled) through the container service.
	idle0 := mustCPU(b, a)
	idleStart := time.Now()
	time.Sleep(2 * time.Second)
	idleRate := float64((mustCPU(b, a) - idle0).Milliseconds()) / time.Since(idleStart).Seconds()

	deletedSeries := `gcagent_projection_events_applied_total{kind="container.deleted"}`
	text = mustMetricsText(b, a)
	deleted0 := footprintMetric(text, deletedSeries)
	received0 := metricSum(text, "gcagent_events_received_total")
	dropped0 := metricSum(text, "gcagent_events_dropped_total")
	cpu0 := mustCPU(b, a)
	churnStart := time.Now()
	ctx := c.Ctx()
	if err := testenv.Parallel(ctx, footprintChurn, 8, func(ctx context.Context, i int) error {
		rec, err := seed.SeedContainer(n + i)
		if err != nil {
			return err
		}
		if _, err := c.Client.ContainerService().Create(ctx, rec); err != nil {
			return err
		}
		return c.Client.ContainerService().Delete(ctx, rec.ID)
	}); err != nil {
		b.Fatalf("churn: %v", err)
	}
	var received, dropped float64
	testenv.Eventually(b, 3*time.Minute, func() string {
		text, err := metricsText(a)
		if err != nil {
			return err.Error()
		}
		received = metricSum(text, "gcagent_events_received_total") - received0
		dropped = metricSum(text, "gcagent_events_dropped_total") - dropped0
		deleted := footprintMetric(text, deletedSeries) - deleted0
		if deleted >= footprintChurn {
			return ""
		}
		// Dropped envelopes are repaired by a listing, which applies no
		// delete for a container it never saw: then the count settles.
		if dropped > 0 && received >= 2*footprintChurn && int(metricSum(text, "gcagent_projection_containers")) == n {
			return ""
		}
		return fmt.Sprintf("%v of %d container deletes applied (%v envelopes received, %v dropped)", deleted, footprintChurn, received, dropped)
	})
	churnTime := time.Since(churnStart)
	cpuChurn := mustCPU(b, a) - cpu0
	churnEvents := 2 * footprintChurn
	cpuPerEvent := float64(cpuChurn.Microseconds()) / 1000 / float64(churnEvents)
	memEnd := mustMemory(b, a)

	// 3. Restart on the same state dir.
	a.Stop()
	start = time.Now()
	a = testenv.StartAgent(b, c, state, flags...)
	readyRestart := waitReady(b, a, start)
	memRestart := mustMemory(b, a)
	b.StopTimer()
	text = mustMetricsText(b, a)
	if got := metricSum(text, "gcagent_projection_containers"); int(got) != n {
		b.Errorf("restarted with %v containers in the projection, want %d", got, n)
	}
	a.Stop()

	b.ReportMetric(float64(readyFirst.Microseconds())/1000, "ready-first-ms")
	b.ReportMetric(float64(readyRestart.Microseconds())/1000, "ready-restart-ms")
	b.ReportMetric(mib(memFirst.RSS), "rss-MiB")
	b.ReportMetric(mib(memEnd.Peak), "peak-MiB")
	b.ReportMetric(mib(memRestart.RSS), "restart-rss-MiB")
	b.ReportMetric(mib(memRestart.Peak), "restart-peak-MiB")
	b.ReportMetric(cpuPerEvent, "cpu-ms/event")
	b.Logf("containerd %s n=%d (seeded in %s) | ready first %s restart %s | rss %.1f MiB peak %.1f MiB, after restart rss %.1f peak %.1f | at first ready: go heap in use %.1f MiB, heap alloc %.1f MiB, go sys %.1f MiB | churn %d events (%v received, %v dropped) in %s: agent cpu %s = %.3f ms/event, idle %.1f ms/s",
		v, n, seeding.Round(time.Millisecond), readyFirst.Round(time.Millisecond), readyRestart.Round(time.Millisecond),
		mib(memFirst.RSS), mib(memEnd.Peak), mib(memRestart.RSS), mib(memRestart.Peak),
		heapInuse/(1<<20), heapAlloc/(1<<20), goSys/(1<<20),
		churnEvents, received, dropped, churnTime.Round(time.Millisecond), cpuChurn, cpuPerEvent, idleRate)
}
