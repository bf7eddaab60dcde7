package gc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// samplePolicy never triggers a pass (high 100, no maximum age), so that a
// sample costs what it costs while nothing is due, whatever the test
// machine's disk holds.
var samplePolicy = ImagePolicy{HighThresholdPercent: 100, LowThresholdPercent: 80, MinAge: 2 * time.Minute}

// BenchmarkImageGCSample is what one disk sample of the image GC loop
// costs: "statfs" the measurement alone, as the agent makes it (node's
// Statfs, with --image-fs set); "evaluate" everything a sample leads to while no
// pass is due (statfs, the trigger, the projection's sequence and sync
// state, the status), over a projection of 10,000 images.
func BenchmarkImageGCSample(b *testing.B) {
	fs := &sampledFS{path: b.TempDir()}
	b.Run("statfs", func(b *testing.B) {
		for b.Loop() {
			if _, err := fs.Disk(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("evaluate", func(b *testing.B) {
		g := mustImageGC(b, ImageGCDeps{Projection: &fakeProjection{state: busyImages(10000)}, Runtime: newFakeRuntime(&fakeDisk{}), Disk: fs}, ImageGCOptions{Policy: samplePolicy, DryRun: true})
		ctx := context.Background()
		for b.Loop() {
			g.evaluate(ctx, true)
		}
		if st := g.Status(); st.Passes != 0 || st.SampledAt.IsZero() {
			b.Fatalf("%d passes, sampled at %s", st.Passes, st.SampledAt)
		}
	})
}

// BenchmarkImageGCSampling runs the image GC loop on Go's timers with
// nothing to do, one second of wall time per iteration, and reports the
// CPU time the process used per second (user and system) and the samples
// taken per second: at the default disk interval on a 100 GiB disk near the
// high threshold (84% used, 85% high: every 100 ms) and far from it (50%:
// every second), and at the former fixed 1 s; "none" is the benchmark
// without the loop. Each sample is a real statfs; the usage it reports is
// the case's.
func BenchmarkImageGCSampling(b *testing.B) {
	const gib = 1 << 30
	policy := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute}
	for _, bc := range []struct {
		name      string
		interval  time.Duration
		available uint64
	}{
		{"default/near", DefaultDiskInterval, 16 * gib},
		{"default/far", DefaultDiskInterval, 50 * gib},
		{"interval=1s/near", time.Second, 16 * gib},
		{"none", 0, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			disk := &sampledFS{path: b.TempDir(), stats: DiskStats{CapacityBytes: 100 * gib, AvailableBytes: bc.available}}
			g := mustImageGC(b, ImageGCDeps{Projection: &fakeProjection{state: busyImages(1000)}, Runtime: newFakeRuntime(&fakeDisk{}), Disk: disk}, ImageGCOptions{Policy: policy, DiskInterval: bc.interval, DryRun: true})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			if bc.interval > 0 {
				go func() { done <- g.Run(ctx) }()
			} else {
				done <- nil
			}
			var cpu, wall time.Duration
			var samples int64
			for b.Loop() {
				c0, s0, t0 := processCPU(b), disk.samples.Load(), time.Now()
				time.Sleep(time.Second) // the period measured, not a wait for the code under test
				cpu, samples, wall = cpu+processCPU(b)-c0, samples+disk.samples.Load()-s0, wall+time.Since(t0)
			}
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			if st := g.Status(); st.Passes != 0 {
				b.Fatalf("%d passes", st.Passes)
			}
			b.ReportMetric(float64(cpu.Microseconds())/wall.Seconds(), "cpu-µs/s")
			b.ReportMetric(float64(samples)/wall.Seconds(), "samples/s")
		})
	}
}

// sampledFS statfs-es fs at each sample, counts the samples, and reports
// stats.
type sampledFS struct {
	path    string
	stats   DiskStats
	samples atomic.Int64
}

func (f *sampledFS) Disk() (DiskStats, error) {
	f.samples.Add(1)
	var st unix.Statfs_t // what node.Statfs costs
	err := unix.Statfs(f.path, &st)
	return f.stats, err
}

// processCPU is the CPU time the process used so far, all threads, user
// and system (CLOCK_PROCESS_CPUTIME_ID: the scheduler's exact runtime;
// getrusage counts whole clock ticks, too coarse for microseconds a second).
func processCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}
