package e2e

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// BenchmarkImageGCReaction measures, on a real daemon with the agent binary
// at its defaults (statfs every 1s, plus on every projection change), the
// time from the moment an import pushes usage over the high threshold (seen
// by a statfs poller in the benchmark) to the first image deleted (the
// daemon's /images/delete event) and to usage back at the low threshold,
// over 20 runs, beside the kubelet's structural figure (a GC loop every 5
// minutes: up to 300 s). Then it compares the executor's delete throughput
// with a loop of `ctr images rm --sync` over the same images.
func BenchmarkImageGCReaction(b *testing.B) {
	for _, v := range testenv.Versions() {
		b.Run(string(v), func(b *testing.B) {
			c := testenv.StartContainerd(b, testenv.Options{Version: v, RootSize: "256m"})
			benchReaction(b, c)
			benchThroughput(b, c)
		})
	}
}

func imgPercentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func imgMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// imgUsage is the kubelet's usage of dir's filesystem: 100 - avail*100/cap
// (so rounded up), and whether it is at or below low (avail at least
// cap*(100-low)/100).
func imgUsage(dir string, low int) (int, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Blocks == 0 {
		return 0, false
	}
	return 100 - int(st.Bavail*100/st.Blocks), st.Bavail*100 >= st.Blocks*uint64(100-low)
}

func benchReaction(b *testing.B, c *testenv.Containerd) {
	const size = 16 * imgMiB // ~32 MiB on disk (blob and snapshot), 12.5% of 256 MiB
	runs := max(20, b.N)
	img := func(i int) testenv.Image {
		return testenv.Image{Name: fmt.Sprintf("bench.test/react/%03d:1", i), Layers: []testenv.Layer{{Seed: fmt.Sprint("react-", i), Size: size}}}
	}
	for i := range 4 {
		c.Import(b, img(i))
	}
	capacity, u0 := imgDisk(b, c.Root)
	// One import (+12.5%) crosses high; deleting the oldest image brings
	// usage back to u0, at or below low.
	low := int(math.Ceil(float64(u0)*100/float64(capacity))) + 2
	high := low + 6
	a := testenv.StartAgent(b, c, b.TempDir(), fmt.Sprintf("--image-gc-high-threshold=%d", high),
		fmt.Sprintf("--image-gc-low-threshold=%d", low), "--minimum-image-ttl-duration=0s", "--prune-containers=off",
		"--log-level=info")
	testenv.Eventually(b, 30*time.Second, func() string {
		var rep projection.Report
		if code, err := a.Get("/status", &rep); err != nil || code != 200 || !rep.Synced {
			return "not synced"
		}
		return ""
	})

	var first, down []time.Duration
	b.ResetTimer()
	for i := range runs {
		ctx, cancel := context.WithTimeout(c.Ctx(), 30*time.Second)
		envs, errs := c.Client.Subscribe(ctx, `topic=="/images/delete"`)
		var crossed, below atomic.Int64
		done := make(chan struct{})
		go func() { // statfs is a few microseconds: poll hard
			defer close(done)
			for ctx.Err() == nil {
				u, atLow := imgUsage(c.Root, low)
				now := time.Now().UnixNano()
				if crossed.Load() == 0 && u >= high {
					crossed.Store(now)
				}
				if crossed.Load() != 0 && atLow {
					below.Store(now)
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
		c.Import(b, img(4+i))
		var deleted time.Time
	wait:
		for {
			select {
			case env := <-envs:
				if deleted.IsZero() {
					deleted = env.Timestamp
				}
			case err := <-errs:
				b.Fatalf("run %d: events: %v", i, err)
			case <-done:
				break wait
			}
		}
		for deleted.IsZero() { // the event may trail the statfs change
			select {
			case env := <-envs:
				deleted = env.Timestamp
			case <-ctx.Done():
				b.Fatalf("run %d: no /images/delete event", i)
			}
		}
		cancel()
		if crossed.Load() == 0 || below.Load() == 0 {
			b.Fatalf("run %d: crossed %d below %d (high %d%% low %d%%)\n%s", i, crossed.Load(), below.Load(), high, low, a.LogTail(20))
		}
		t0 := time.Unix(0, crossed.Load())
		first = append(first, deleted.Sub(t0))
		down = append(down, time.Unix(0, below.Load()).Sub(t0))
	}
	b.StopTimer()
	b.ReportMetric(imgMs(imgPercentile(first, 50)), "p50-first-delete-ms")
	b.ReportMetric(imgMs(imgPercentile(first, 99)), "p99-first-delete-ms")
	b.ReportMetric(imgMs(imgPercentile(down, 50)), "p50-low-reached-ms")
	b.ReportMetric(imgMs(imgPercentile(down, 99)), "p99-low-reached-ms")
	b.ReportMetric(300000, "kubelet-max-ms")
	b.Logf("%s: %d runs, high %d%% low %d%%: first delete p50 %s p99 %s; low reached p50 %s p99 %s; kubelet: up to 300s (5-minute GC loop)",
		c.Version, runs, high, low, imgPercentile(first, 50), imgPercentile(first, 99), imgPercentile(down, 50), imgPercentile(down, 99))
	a.Kill()
}

// benchThroughput deletes the same set of images twice: through the
// executor (re-check, CRI or native delete of all names, statfs after each)
// and through a plain loop of `ctr images rm --sync` with all their names.
func benchThroughput(b *testing.B, c *testenv.Containerd) {
	const n = 30
	imgs := make([]testenv.Image, n)
	for i := range imgs {
		imgs[i] = testenv.Image{Name: fmt.Sprintf("bench.test/tp/%03d:1", i), Layers: []testenv.Layer{{Seed: fmt.Sprint("tp-", i), Size: 256 << 10}}}
	}
	ctx := c.Ctx()
	names := func() map[string][]string { // digest -> names, throughput images only
		out := map[string][]string{}
		all, err := c.Client.ImageService().List(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ours := map[string]bool{}
		for _, im := range all {
			for _, want := range imgs {
				if im.Name == want.Name {
					ours[im.Target.Digest.String()] = true
				}
			}
		}
		for _, im := range all {
			if d := im.Target.Digest.String(); ours[d] {
				out[d] = append(out[d], im.Name)
			}
		}
		return out
	}
	settle := func() { // CRI adds its image id names from events
		testenv.Eventually(b, 10*time.Second, func() string {
			for d, ns := range names() {
				if len(ns) < 2 {
					return d + ": CRI id name not there yet"
				}
			}
			return ""
		})
	}

	// Executor: one pass whose policy makes every throughput image a candidate.
	c.Import(b, imgs...)
	settle()
	rt, ri := c.CRI(b)
	src := node.NewSource(node.Options{Client: c.Client, CRI: rt, Log: zerolog.Nop()})
	live, err := projection.NewLive(projection.LiveOptions{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := src.List(ctx, testenv.Namespace)
	if err != nil {
		b.Fatal(err)
	}
	live.Apply(l)
	nrt := node.NewRuntime(c.Client, rt, ri)
	deletes, err := deletion.New(deletion.Deps{Journal: memJournal{}, Checker: nrt}, deletion.Options{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := gc.NewImageGC(gc.ImageGCDeps{Projection: live, Runtime: nrt, Deletes: deletes, Disk: node.Statfs{Path: c.Root}},
		gc.ImageGCOptions{Log: zerolog.Nop(),
			Policy: gc.ImagePolicy{HighThresholdPercent: 0, LowThresholdPercent: 0, KeepPatterns: []string{"bench.test/react/*"}},
		})
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	pass := g.Pass(context.Background(), "manual")
	execTook := time.Since(began)
	if len(pass.Removed) != n || pass.Error != "" {
		b.Fatalf("executor removed %d of %d: %s", len(pass.Removed), n, pass.Error)
	}
	if left := names(); len(left) != 0 {
		b.Fatalf("executor left %v", left)
	}

	// ctr: the same images again, one `ctr images rm --sync` per image.
	c.Import(b, imgs...)
	settle()
	byDigest := names()
	began = time.Now()
	for _, ns := range byDigest {
		args := append([]string{"--address", c.Address, "-n", testenv.Namespace, "images", "rm", "--sync"}, ns...)
		if out, err := exec.Command("/usr/bin/ctr", args...).CombinedOutput(); err != nil {
			b.Fatalf("ctr %v: %v\n%s", args, err, out)
		}
	}
	ctrTook := time.Since(began)
	if left := names(); len(left) != 0 {
		b.Fatalf("ctr left %v", left)
	}
	execRate, ctrRate := float64(n)/execTook.Seconds(), float64(n)/ctrTook.Seconds()
	b.ReportMetric(execRate, "executor-images/s")
	b.ReportMetric(ctrRate, "ctr-rm-images/s")
	b.ReportMetric(execRate/ctrRate, "executor/ctr-ratio")
	b.Logf("%s: %d images (2 names each): executor %s (%.0f/s, with re-check and statfs per image), ctr images rm --sync loop %s (%.0f/s): ratio %.1f",
		c.Version, n, execTook.Round(time.Millisecond), execRate, ctrTook.Round(time.Millisecond), ctrRate, execRate/ctrRate)
}

// memJournal keeps no intents: a benchmark has no crash to survive.
type memJournal struct{}

func (memJournal) Intend(ns string, a schema.Action, id *deletion.Identity) (deletion.Intent, error) {
	return deletion.Intent{Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key, Identity: id}, nil
}
func (memJournal) Complete(deletion.Intent, any) error { return nil }
func (memJournal) Abandon(deletion.Intent) error       { return nil }
func (memJournal) Pending() ([]deletion.Intent, error) { return nil, nil }
func (memJournal) Publish(schema.Action) error         { return nil }
