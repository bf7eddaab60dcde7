package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
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

// footprintSeeds are the seeds measured: FOOTPRINT_SEEDS as a
// comma-separated list of footprintSeed's kinds, default both.
func footprintSeeds(b *testing.B) []string {
	v := os.Getenv("FOOTPRINT_SEEDS")
	if v == "" {
		return []string{"unpacked", "fetched"}
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if _, ok := footprintSeed(s, 1); !ok {
			b.Fatalf("FOOTPRINT_SEEDS=%q: %q is neither unpacked nor fetched", v, s)
		}
		out = append(out, s)
	}
	return out
}

// footprintSeed is the seed of kind with n images and n containers:
//   - unpacked: every image named and id-referenced as CRI pulls it, and
//     unpacked (its config labelled with its chain id, so that a first
//     listing takes its facts from the content store's labels);
//   - fetched: pulled but not unpacked, as `ctr content fetch`, buildkit or
//     a pre-pull cache leave them, named by their tag only (CRI names and
//     labels them itself in the background, before the agent starts): a
//     first listing reads each image's config.
//
// Half the containers are labelled like CRI containers, each with a rootfs
// snapshot key as CRI gives them (of no snapshot: each create costs the
// agent the lookup a real one does).
func footprintSeed(kind string, n int) (testenv.Seed, bool) {
	switch kind {
	case "unpacked":
		return testenv.Seed{Images: n, Containers: n, CRIManaged: true, RootfsKeys: true}, true
	case "fetched":
		return testenv.Seed{Images: n, Containers: n, Fetched: true, RootfsKeys: true}, true
	}
	return testenv.Seed{}, false
}

// BenchmarkFootprint measures the agent binary at the size of a busy node
// (issue #11): a private containerd (the newest of testenv.Versions()) whose
// stores are seeded with n images and n containers (footprintSeed, each of
// footprintSeeds), and the agent at its defaults (log level info).
// containerd's root is a tmpfs (seeding takes seconds), the agent's state
// dir is on disk. Before each agent runs and after it stopped, the same
// churns as below run against containerd alone: its own CPU per event, the
// mean of which the agent's is compared with. It reports
//   - ready-first-ms: process start to the first /readyz 200, empty state;
//   - settle-ms: how long after that first ready the agent stays busy (the
//     first snapshot, GC passes) until it uses under 5% of a core;
//   - ready-restart-ms: after SIGTERM, start on the same state dir to 200;
//   - rss-MiB: VmRSS at the first ready; idle-rss-MiB: VmRSS footprintIdle
//     after it settled; peak-MiB: VmHWM at the end of the first run (after
//     settling and the churns); restart-rss-MiB: VmRSS at the ready after
//     the restart; restart-peak-MiB: VmHWM once the restarted agent
//     settled;
//   - cpu-ms/event: the agent's utime+stime while footprintChurn
//     containers are created and deleted through the container service, 8
//     at a time, until all their deletes are applied, per containerd event
//     (idle included: it is logged, a few ms/s); serial-cpu-ms/event: the
//     same for a quarter as many, one at a time;
//   - ctrd-cpu-ms/event, ctrd-serial-cpu-ms/event: containerd's own CPU per
//     event for the same two churns with no agent following it (the mean of
//     before and after the agent);
//     cpu-ratio, serial-cpu-ratio: the agent's CPU per event over those
//     (what containerd spends meanwhile answering the agent's lookups is
//     logged);
//   - image-plan-ms, container-plan-ms: one image GC plan (kubelet
//     thresholds, a full disk) and one full container GC plan
//     (--prune-containers=all) on the projection the agent persisted,
//     loaded while it is stopped before the restart.
//
// FOOTPRINT_SIZES overrides n (default 1000,10000), FOOTPRINT_SEEDS the
// seeds (default unpacked,fetched); FOOTPRINT_NATS=external
// gives each agent a NATS server of its own (in the benchmark's process)
// instead of its embedded one, as a fleet with one NATS runs it; FOOTPRINT_PERF=dir
// records perf profiles of the first start, the settling, the churns and
// the restart; FOOTPRINT_HEAP=dir saves heap profiles (--profiling);
// FOOTPRINT_BASELINE=path measures that agent binary first, on the same
// daemon, to compare side by side on a noisy machine (FOOTPRINT_BASELINE_LAST
// set: after this one, as the first agent on a freshly seeded daemon pays
// for what containerd caches). One run is the workload: -benchtime=1x.
func BenchmarkFootprint(b *testing.B) {
	vs := testenv.Versions()
	v := vs[len(vs)-1]
	for _, n := range footprintSizes(b) {
		for _, kind := range footprintSeeds(b) {
			b.Run(fmt.Sprintf("n=%d/%s", n, kind), func(b *testing.B) {
				for range b.N {
					benchFootprint(b, v, n, kind)
				}
			})
		}
	}
}

// footprintMetric sums the samples of metric name in a /metrics text whose
// labels include every one of labels (e.g. `kind="container.deleted"`), so
// it does not depend on which other labels (a namespace) a series has.
func footprintMetric(text, name string, labels ...string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		set, value := "", rest
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			set, value = rest[1:end], rest[end+1:]
		}
		if !slices.ContainsFunc(labels, func(want string) bool { return !slices.Contains(strings.Split(set, ","), want) }) {
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				sum += v
			}
		}
	}
	return sum
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

func mustSwitches(b *testing.B, a *testenv.Agent) int64 {
	b.Helper()
	n, err := testenv.ReadProcSwitches(a.Pid())
	if err != nil {
		b.Fatal(err)
	}
	return n
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

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// footprintIdle is how long the agent is left idle after it settled before
// its idle RSS is read: long enough for it to return its last work's
// garbage (two of its 5 s heap checks), as it does on a node that waits.
const footprintIdle = 12 * time.Second

// waitQuiet waits until process pid (what) has used less than 5% of a core
// over the last second (up to 2 minutes), sampling every 200ms, and returns
// how long it stayed busy (to the start of that quiet second) and the CPU
// it used meanwhile.
func waitQuiet(b *testing.B, pid int, what string) (time.Duration, time.Duration) {
	b.Helper()
	cpuOf := func() time.Duration {
		d, err := testenv.ReadProcCPU(pid)
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		return d
	}
	type sample struct {
		at  time.Time
		cpu time.Duration
	}
	start, cpu0 := time.Now(), cpuOf()
	window := []sample{{start, cpu0}}
	for time.Since(start) < 2*time.Minute {
		time.Sleep(200 * time.Millisecond)
		now := sample{time.Now(), cpuOf()}
		window = append(window, now)
		for len(window) > 2 && now.at.Sub(window[1].at) >= time.Second {
			window = window[1:]
		}
		if old := window[0]; now.at.Sub(old.at) >= time.Second && now.cpu-old.cpu < 50*time.Millisecond {
			return old.at.Sub(start), old.cpu - cpu0
		}
	}
	b.Fatalf("%s still busy after 2 minutes", what)
	return 0, 0
}

// churnResult is what the agent spent following one churn, and
// containerd meanwhile.
type churnResult struct {
	events            int
	received, dropped float64
	took, cpu         time.Duration
	cpuPerEventMs     float64
	switchesPerEvent  float64
	// ctrdPerEventMs is containerd's CPU per event over the same time.
	ctrdPerEventMs float64
}

// churnCreates creates and deletes count containers (seed's records
// n+first ..., half CRI-labelled) through the container service on
// workers goroutines.
func churnCreates(b *testing.B, c *testenv.Containerd, seed testenv.Seed, n, first, count, workers int) {
	b.Helper()
	if err := testenv.Parallel(c.Ctx(), count, workers, func(ctx context.Context, i int) error {
		rec, err := seed.SeedContainer(n + first + i)
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
}

// ctrdChurns are containerd's own CPU per event (ms) for the two churns
// measureFootprint runs, with no agent following it.
type ctrdChurns struct{ burst, serial float64 }

// churnAlone runs the churns measureFootprint runs against containerd
// alone and returns its CPU per event for each.
func churnAlone(b *testing.B, c *testenv.Containerd, seed testenv.Seed, n int) ctrdChurns {
	b.Helper()
	run := func(first, count, workers int) float64 {
		cpu0 := mustProcCPU(b, c.Pid())
		churnCreates(b, c, seed, n, first, count, workers)
		return ms(mustProcCPU(b, c.Pid())-cpu0) / float64(2*count)
	}
	return ctrdChurns{burst: run(0, footprintChurn, 8), serial: run(footprintChurn, footprintChurn/4, 1)}
}

func mustProcCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	d, err := testenv.ReadProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// churn runs churnCreates, waits until the agent has applied every
// delete, and returns the agent's CPU time over it (and containerd's).
func churn(b *testing.B, c *testenv.Containerd, a *testenv.Agent, seed testenv.Seed, n, first, count, workers int) churnResult {
	b.Helper()
	deletes := func(text string) float64 {
		return footprintMetric(text, "gcagent_projection_events_applied_total", `kind="container.deleted"`)
	}
	text := mustMetricsText(b, a)
	deleted0 := deletes(text)
	received0 := metricSum(text, "gcagent_events_received_total")
	dropped0 := metricSum(text, "gcagent_events_dropped_total")
	switches0 := mustSwitches(b, a)
	ctrd0 := mustProcCPU(b, c.Pid())
	cpu0, start := mustCPU(b, a), time.Now()
	churnCreates(b, c, seed, n, first, count, workers)
	r := churnResult{events: 2 * count}
	// Each look is a /metrics scrape the agent pays for: four a second
	// (Prometheus scrapes every 15 s or more).
	testenv.EventuallyEvery(b, 3*time.Minute, 250*time.Millisecond, func() string {
		text, err := metricsText(a)
		if err != nil {
			return err.Error()
		}
		r.received = metricSum(text, "gcagent_events_received_total") - received0
		r.dropped = metricSum(text, "gcagent_events_dropped_total") - dropped0
		deleted := deletes(text) - deleted0
		if deleted >= float64(count) {
			return ""
		}
		// Dropped envelopes are repaired by a listing, which applies no
		// delete for a container it never saw: then the count settles.
		if r.dropped > 0 && r.received >= float64(r.events) && int(metricSum(text, "gcagent_projection_containers")) == n {
			return ""
		}
		return fmt.Sprintf("%v of %d container deletes applied (%v envelopes received, %v dropped)", deleted, count, r.received, r.dropped)
	})
	r.took, r.cpu = time.Since(start), mustCPU(b, a)-cpu0
	r.cpuPerEventMs = ms(r.cpu) / float64(r.events)
	r.ctrdPerEventMs = ms(mustProcCPU(b, c.Pid())-ctrd0) / float64(r.events)
	r.switchesPerEvent = float64(mustSwitches(b, a)-switches0) / float64(r.events)
	return r
}

// startPerf records a CPU profile of the agent with perf into dir/name.data
// when FOOTPRINT_PERF names a dir (the agent serves no pprof); stop ends it.
func startPerf(b *testing.B, a *testenv.Agent, name string) (stop func()) {
	dir := os.Getenv("FOOTPRINT_PERF")
	if dir == "" {
		return func() {}
	}
	cmd := exec.Command("perf", "record", "-q", "-F", "499", "-g", "-p", fmt.Sprint(a.Pid()), "-o", filepath.Join(dir, name+".data"))
	if err := cmd.Start(); err != nil {
		b.Fatalf("FOOTPRINT_PERF: %v", err)
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
}

func benchFootprint(b *testing.B, v testenv.Version, n int, kind string) {
	// containerd's root on a tmpfs: its metadata commits do not wait for a
	// disk, so seeding 10,000 records takes seconds. The agent's state dir
	// stays on disk.
	c := testenv.StartContainerd(b, testenv.Options{Version: v, RootSize: "2g"})
	seed, _ := footprintSeed(kind, n)
	began := time.Now()
	c.SeedRecords(b, seed)
	seeding := time.Since(began)
	// The agent starts once containerd has digested the seeding (CRI
	// follows its events).
	ctrdBusy, _ := waitQuiet(b, c.Pid(), "containerd")
	b.Logf("seeded %s in %s, containerd then busy %s more", kind, seeding.Round(time.Millisecond), ctrdBusy.Round(time.Millisecond))
	// FOOTPRINT_BASELINE, another agent binary, is measured on the same
	// daemon, first (last with FOOTPRINT_BASELINE_LAST), so that the two
	// are compared side by side.
	// This agent is built as `make image` builds it, the binary a
	// DaemonSet runs (static: no libc mapped), with FOOTPRINT_TAGS as its
	// build tags ("noembeddednats" needs FOOTPRINT_NATS=external).
	tags := os.Getenv("FOOTPRINT_TAGS")
	if strings.Contains(tags, "noembeddednats") && os.Getenv("FOOTPRINT_NATS") != "external" {
		b.Fatal("FOOTPRINT_TAGS=noembeddednats: the agent needs a NATS of its own, set FOOTPRINT_NATS=external")
	}
	agents := []struct{ label, bin string }{{"this", testenv.AgentBuild(b, testenv.Build{Tags: tags, Static: true})}} // built before the clock starts
	if base := os.Getenv("FOOTPRINT_BASELINE"); base != "" {
		agents = append([]struct{ label, bin string }{{"baseline", base}}, agents...)
		if os.Getenv("FOOTPRINT_BASELINE_LAST") != "" {
			agents[0], agents[1] = agents[1], agents[0]
		}
	}
	b.ResetTimer()
	for _, ag := range agents {
		measureFootprint(b, c, seed, n, v, ag.label, ag.bin)
	}
}

// measureFootprint starts the agent binary bin on c (seeded with seed, n
// of each), measures it (BenchmarkFootprint) and logs the figures under
// label; only "this" reports metrics.
func measureFootprint(b *testing.B, c *testenv.Containerd, seed testenv.Seed, n int, v testenv.Version, label, bin string) {
	// containerd's own CPU per event, before this agent runs and after it
	// stopped: the host's load moves over a run, and the agent's churns are
	// compared with the mean of the two around it.
	var report func(alone, before, after ctrdChurns) // once the agent's figures are in
	before := churnAlone(b, c, seed, n)
	defer func() {
		if report == nil {
			return // failed
		}
		after := churnAlone(b, c, seed, n)
		report(ctrdChurns{burst: (before.burst + after.burst) / 2, serial: (before.serial + after.serial) / 2}, before, after)
	}()
	state := filepath.Join(b.TempDir(), "state")
	flags := []string{"--log-level=info"}
	if os.Getenv("FOOTPRINT_NATS") == "external" { // as a fleet runs it: one NATS, no embedded server
		flags = append(flags, "--nats-url="+testenv.StartNATS(b, testenv.NATSOptions{JetStream: true}).ClientURL())
	}
	if os.Getenv("FOOTPRINT_HEAP") != "" {
		flags = append(flags, "--profiling")
	}

	// 1. First start, empty state dir.
	ctrdCPU0, err := testenv.ReadProcCPU(c.Pid())
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	a := testenv.StartAgentBin(b, bin, c, state, nil, flags...)
	stopPerf := startPerf(b, a, fmt.Sprintf("%s-first-n%d", label, n))
	readyFirst := waitReady(b, a, start)
	memFirst := mustMemory(b, a)
	saveHeap(b, a, fmt.Sprintf("%s-heap-first-n%d.pb.gz", label, n))
	cpuFirst := mustCPU(b, a)
	ctrdCPU, err := testenv.ReadProcCPU(c.Pid())
	if err != nil {
		b.Fatal(err)
	}
	ctrdCPU -= ctrdCPU0
	stopPerf()
	text := mustMetricsText(b, a)
	if got := footprintMetric(text, "gcagent_projection_images"); int(got) != n {
		b.Fatalf("ready with %v images in the projection, want %d", got, n)
	}
	if got := metricSum(text, "gcagent_projection_containers"); int(got) != n {
		b.Fatalf("ready with %v containers in the projection, want %d", got, n)
	}
	listing := footprintMetric(text, "gcagent_events_listing_duration_seconds_sum")
	heapInuse := footprintMetric(text, "go_memstats_heap_inuse_bytes")
	goSys := footprintMetric(text, "go_memstats_sys_bytes")

	// The work a start leaves after ready (the first snapshot of the whole
	// projection, GC passes over it) ends before the churn is measured.
	stopPerf = startPerf(b, a, fmt.Sprintf("%s-settle-n%d", label, n))
	settle, settleCPU := waitQuiet(b, a.Pid(), "agent")
	stopPerf()
	idle0, idleStart := mustCPU(b, a), time.Now()
	time.Sleep(footprintIdle)
	idleRate := ms(mustCPU(b, a)-idle0) / time.Since(idleStart).Seconds()
	memIdle := mustMemory(b, a) // settled: what the node pays while nothing happens
	text = mustMetricsText(b, a)
	idleHeap, idleFree := footprintMetric(text, "go_memstats_heap_inuse_bytes"),
		footprintMetric(text, "go_memstats_heap_idle_bytes")-footprintMetric(text, "go_memstats_heap_released_bytes")
	idleObjects := footprintMetric(text, "go_memstats_heap_alloc_bytes")

	// 2. Churn: a burst on 8 goroutines (events arrive faster than one at a
	// time, and are applied and journaled in batches), then one at a time.
	stopPerf = startPerf(b, a, fmt.Sprintf("%s-churn-n%d", label, n))
	burst := churn(b, c, a, seed, n, 0, footprintChurn, 8)
	serial := churn(b, c, a, seed, n, footprintChurn, footprintChurn/4, 1)
	stopPerf()
	memEnd := mustMemory(b, a)
	saveHeap(b, a, fmt.Sprintf("%s-heap-end-n%d.pb.gz", label, n))
	text = mustMetricsText(b, a)
	heapEnd := footprintMetric(text, "go_memstats_heap_inuse_bytes")

	// 3. Restart on the same state dir; in between, the GC planners run on
	// the projection the agent persisted.
	a.Stop()
	var imagePlan, containerPlan time.Duration
	if label == "this" { // this test's planners: the same code for any binary
		imagePlan, containerPlan = planTimes(b, state)
	}
	start = time.Now()
	a = testenv.StartAgentBin(b, bin, c, state, nil, flags...)
	stopPerf = startPerf(b, a, fmt.Sprintf("%s-restart-n%d", label, n))
	readyRestart := waitReady(b, a, start)
	stopPerf()
	memRestart := mustMemory(b, a)
	cpuRestart := mustCPU(b, a)
	waitQuiet(b, a.Pid(), "agent")
	memRestartSettled := mustMemory(b, a)
	saveHeap(b, a, fmt.Sprintf("%s-heap-restart-n%d.pb.gz", label, n))
	b.StopTimer()
	text = mustMetricsText(b, a)
	if got := metricSum(text, "gcagent_projection_containers"); int(got) != n {
		b.Errorf("restarted with %v containers in the projection, want %d", got, n)
	}
	a.Stop()

	report = func(alone, before, after ctrdChurns) {
		if label == "this" {
			b.ReportMetric(ms(readyFirst), "ready-first-ms")
			b.ReportMetric(ms(readyRestart), "ready-restart-ms")
			b.ReportMetric(mib(memFirst.RSS), "rss-MiB")
			b.ReportMetric(mib(memIdle.RSS), "idle-rss-MiB")
			b.ReportMetric(mib(memEnd.Peak), "peak-MiB")
			b.ReportMetric(mib(memRestart.RSS), "restart-rss-MiB")
			b.ReportMetric(mib(memRestartSettled.Peak), "restart-peak-MiB")
			b.ReportMetric(burst.cpuPerEventMs, "cpu-ms/event")
			b.ReportMetric(serial.cpuPerEventMs, "serial-cpu-ms/event")
			b.ReportMetric(alone.burst, "ctrd-cpu-ms/event")
			b.ReportMetric(alone.serial, "ctrd-serial-cpu-ms/event")
			b.ReportMetric(burst.cpuPerEventMs/alone.burst, "cpu-ratio")
			b.ReportMetric(serial.cpuPerEventMs/alone.serial, "serial-cpu-ratio")
			b.ReportMetric(ms(settle), "settle-ms")
			b.ReportMetric(ms(imagePlan), "image-plan-ms")
			b.ReportMetric(ms(containerPlan), "container-plan-ms")
		}
		// Four lines per agent: a benchmark's log is cut after ten.
		b.Logf("%s: | containerd %s | n=%d | ready first %s, restart %s | idle %.1f MiB, peak %.1f MiB, restart peak %.1f MiB | %.3f ms/event (serial %.3f, %.2f× containerd's) |",
			label, v, n, readyFirst.Round(time.Millisecond), readyRestart.Round(time.Millisecond), mib(memIdle.RSS), mib(memEnd.Peak), mib(memRestartSettled.Peak),
			burst.cpuPerEventMs, serial.cpuPerEventMs, serial.cpuPerEventMs/alone.serial)
		b.Logf("%s: ready first %s (agent cpu %s, containerd cpu %s, listing %.2fs), restart %s (agent cpu %s), then busy %s more (cpu %s), idle at %.1f ms/s; "+
			"rss at first ready %.1f MiB (go heap in use %.1f, go sys %.1f), idle after ready %.1f MiB (anon %.1f, file %.1f; go heap in use %.1f, objects %.1f, free pages kept %.1f), at the end %.1f MiB (anon %.1f, heap in use %.1f), peak %.1f MiB; restart rss %.1f (anon %.1f), settled %.1f, peak %.1f MiB",
			label, readyFirst.Round(time.Millisecond), cpuFirst, ctrdCPU, listing, readyRestart.Round(time.Millisecond), cpuRestart,
			settle.Round(time.Millisecond), settleCPU, idleRate,
			mib(memFirst.RSS), heapInuse/(1<<20), goSys/(1<<20), mib(memIdle.RSS), mib(memIdle.Anon), mib(memIdle.File),
			idleHeap/(1<<20), idleObjects/(1<<20), idleFree/(1<<20), mib(memEnd.RSS), mib(memEnd.Anon), heapEnd/(1<<20), mib(memEnd.Peak), mib(memRestart.RSS), mib(memRestart.Anon),
			mib(memRestartSettled.RSS), mib(memRestartSettled.Peak))
		plans := ""
		if label == "this" {
			plans = fmt.Sprintf("; plans on the persisted projection: image GC (kubelet thresholds, disk full) %s, container GC (--prune-containers=all) %s",
				imagePlan.Round(time.Microsecond), containerPlan.Round(time.Microsecond))
		}
		b.Logf("%s: churn burst (8 at a time) %d events (%v received, %v dropped) in %s, agent cpu %s = %.3f ms/event (%.1f thread switches/event; containerd meanwhile %.3f, alone %.3f); "+
			"serial %d events in %s, agent cpu %s = %.3f ms/event (%.1f switches/event; containerd meanwhile %.3f, alone %.3f)%s",
			label, burst.events, burst.received, burst.dropped, burst.took.Round(time.Millisecond), burst.cpu, burst.cpuPerEventMs, burst.switchesPerEvent, burst.ctrdPerEventMs, alone.burst,
			serial.events, serial.took.Round(time.Millisecond), serial.cpu, serial.cpuPerEventMs, serial.switchesPerEvent, serial.ctrdPerEventMs, alone.serial, plans)
		b.Logf("%s: containerd alone, before and after this agent: %.3f and %.3f ms/event in the burst, %.3f and %.3f one at a time",
			label, before.burst, after.burst, before.serial, after.serial)
	}
}

// saveHeap writes the agent's heap profile into FOOTPRINT_HEAP (a dir),
// when set: the agent then runs with --profiling.
func saveHeap(b *testing.B, a *testenv.Agent, name string) {
	dir := os.Getenv("FOOTPRINT_HEAP")
	if dir == "" {
		return
	}
	resp, err := http.Get("http://" + a.Addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatalf("FOOTPRINT_HEAP: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("FOOTPRINT_HEAP: %d %v", resp.StatusCode, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
		b.Fatal(err)
	}
}

// planTimes loads the projection the agent persisted in stateDir (the
// agent stopped) and times one image GC plan (kubelet thresholds on a full
// disk: every image is ranked) and one full container GC plan
// (--prune-containers=all), each the fastest of three.
func planTimes(b *testing.B, stateDir string) (image, container time.Duration) {
	b.Helper()
	st, err := projection.OpenStoreReadOnly(filepath.Join(stateDir, "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	loaded, err := st.LoadSpaces()
	if err != nil {
		b.Fatal(err)
	}
	var states []*projection.State
	for _, res := range loaded {
		res.State.Synced = true
		states = append(states, res.State)
	}
	now := time.Now()
	fastest := func(fn func()) time.Duration {
		best := time.Duration(1<<63 - 1)
		for range 3 {
			t0 := time.Now()
			fn()
			best = min(best, time.Since(t0))
		}
		return best
	}
	image = fastest(func() {
		gc.PlanImages(states, gc.DiskStats{CapacityBytes: 100 << 30, AvailableBytes: 0},
			gc.ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute}, now)
	})
	container = fastest(func() {
		gc.PlanContainersAcross(states, gc.ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: gc.PruneAll}, now, nil)
	})
	return image, container
}
