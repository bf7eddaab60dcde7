//go:build soak

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSoak is `make soak`: for GCAGENT_TEST_SOAK (a duration, e.g. 2h), the
// default agent binary (its embedded NATS server running) follows each
// daemon of testenv.Versions(), both at once, under mixed load: images
// imported about every second onto a small disk, so that image GC deletes
// them under pressure; a plain container run every second, which exits and
// is pruned; a dangling kubelet log link every two seconds, which is
// removed. Every minute it records the agent's resident memory (and its
// anonymous and file-backed parts), Go heap, open file descriptors and
// goroutines, and what the load and the agent did. At the end it stops the
// load, waits until the agent has caught up, and checks that every image,
// container and link the agent removed is one action stored once in
// JetStream, and nothing else removed. It writes, per daemon, into
// GCAGENT_TEST_SOAK_DIR (default a temporary dir): soak-<v>.csv (one row a
// minute) and soak-<v>.md, a table by ten minutes with a line that says
// whether resident memory plateaus, ready for docs/figures.md; with
// GCAGENT_TEST_SOAK_PROFILE set, the agent runs with --profiling and its
// heap profiles at the first minute and at the end go there too.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("GCAGENT_TEST_SOAK"))
	if err != nil || d < time.Minute {
		t.Fatalf("GCAGENT_TEST_SOAK=%q: want a duration of a minute or more (make soak SOAK=2h)", os.Getenv("GCAGENT_TEST_SOAK"))
	}
	out := os.Getenv("GCAGENT_TEST_SOAK_DIR")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range testenv.Versions() {
		t.Run("containerd-"+string(v), func(t *testing.T) {
			t.Parallel()
			soak(t, v, d, out)
		})
	}
}

// soakSample is one minute of the soak.
type soakSample struct {
	At                   time.Duration // since the load started
	RSS, Anon, File      int64         // bytes
	HeapInuse, HeapAlloc float64       // bytes (go_memstats)
	FDs, Goroutines      float64
	Imported, ImagesGone int64
	Ran, ContainersGone  int64
	Links, LinksGone     int64
	Stored               uint64  // messages in the events stream
	Deletions            float64 // held for the regret window (gcagent_projection_regret_deletions)
	AgentCPU             time.Duration
}

// soakLoad is what the load did, for the final check.
type soakLoad struct {
	mu         sync.Mutex
	images     []string // names imported
	containers []string // ids run
	links      []string // link names made
	podDirs    []string // pod log dirs made
	// interrupted are containers whose run the end of the load cut short:
	// a container never started is not dead, so the load removes those
	// the agent did not.
	interrupted           []string
	imported, ran, linked atomic.Int64
}

func (l *soakLoad) add(list *[]string, s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*list = append(*list, s)
}

func soak(t *testing.T, v testenv.Version, d time.Duration, out string) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "384m"})
	c.Import(t, testenv.Runnable("soak.test/run:1"), testenv.Pause(c.SandboxImage))
	// A pod runs all along, as on every node (the agent's own, on a
	// DaemonSet install): its sandbox's log dir shows the agent that the
	// pod log dir holds the watched containerd's pods, without which it
	// removes no orphaned pod dir and no dangling link of a container it
	// does not know. It goes when the load stops, its dir with it.
	rt, _ := c.CRI(t)
	node := c.RunPod(t, rt, "soak-node", "kube-system", "50a60000-node")
	natsAddr := testenv.FreeAddr(t)
	base := usagePercent(t, c.Root)
	high, low := base+30, base+15
	// A binary of its own, as one node runs one agent: the kernel pages
	// out only what one process maps (pageOutBinary).
	bin := filepath.Join(t.TempDir(), "gcagent")
	if b, err := os.ReadFile(testenv.AgentBinary(t)); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the agent binary: %v", err)
	}
	flags := []string{"--log-level=info", "--embedded-nats-listen=" + natsAddr,
		fmt.Sprintf("--image-gc-high-threshold=%d", high), fmt.Sprintf("--image-gc-low-threshold=%d", low),
		"--minimum-image-ttl-duration=20s", "--keep-image=soak.test/run:*",
		"--uncollected-exit-grace=1s", "--pod-log-grace=2s"}
	profile := os.Getenv("GCAGENT_TEST_SOAK_PROFILE") != "" // heap profiles at the first minute and at the end
	if profile {
		flags = append(flags, "--profiling")
	}
	a := testenv.StartAgentBin(t, bin, c, filepath.Join(t.TempDir(), "state"), nil, flags...)
	natsWaitSynced(t, a)
	// The embedded server takes the agent's local key only (local tools
	// read it from the state dir).
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(a.StateDir, natsbus.LocalNkeyFile))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+natsAddr, seed, nats.Name("soak"), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	var load soakLoad
	begin := time.Now()
	ctx, stop := context.WithDeadline(c.Ctx(), begin.Add(d))
	defer stop()
	var wg sync.WaitGroup
	fail := make(chan error, 3)
	every := func(period time.Duration, step func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(period)
			defer tick.Stop()
			for i := 0; ; i++ {
				// A call cut by the end of the load is no failure (gRPC
				// may see the deadline before the context says so).
				if err := step(i); err != nil && ctx.Err() == nil && time.Until(begin.Add(d)) > time.Second {
					fail <- err
					stop()
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	// Images: 4 MiB of data each (twice on disk: content and snapshot),
	// under a lease as a pull imports them.
	every(time.Second, func(i int) error {
		name := fmt.Sprintf("soak.test/img-%06d:1", i)
		if err := soakImport(ctx, c, testenv.Image{Name: name, Layers: []testenv.Layer{{Seed: fmt.Sprintf("soak-%s-%d", v, i), Size: 4 << 20}}}); err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
		load.add(&load.images, name)
		load.imported.Add(1)
		return nil
	})
	// Containers: a plain container that exits at once; its task is left
	// for the agent (uncollected) on even ones, deleted by its owner on odd
	// ones (collected), as `ctr run --rm`-less clients and `ctr run` do.
	every(time.Second, func(i int) error {
		id := fmt.Sprintf("soak-c-%06d", i)
		created, err := soakRun(ctx, c, id, i%2 == 1)
		switch {
		case err != nil && created:
			load.add(&load.interrupted, id) // removed below, by the agent or the load
			return fmt.Errorf("run %s: %w", id, err)
		case err != nil:
			return fmt.Errorf("run %s: %w", id, err)
		}
		load.add(&load.containers, id)
		load.ran.Add(1)
		return nil
	})
	// Logs: a pod's log dir with its container's log, and the kubelet's
	// link to it, of a pod with no sandbox (a pod deleted while the node
	// was down): the agent sees the dir, collects it as orphaned once it
	// has been quiet for --pod-log-grace, and then the link, dangling.
	every(2*time.Second, func(i int) error {
		pod := fmt.Sprintf("default_soak%06d_%08x-0000-4000-8000-%012x", i, i, i)
		name := fmt.Sprintf("soak%06d_default_app-%064x.log", i, i)
		log := filepath.Join(c.PodLogDir, pod, "app", "0.log")
		if err := os.MkdirAll(filepath.Dir(log), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(log, []byte("soak\n"), 0o644); err != nil {
			return err
		}
		if err := os.Symlink(log, filepath.Join(c.LogDir, name)); err != nil {
			return err
		}
		load.add(&load.podDirs, pod)
		load.add(&load.links, name)
		load.linked.Add(1)
		return nil
	})

	var samples []soakSample
	sample := func() {
		m, err := testenv.ReadProcMemory(a.Pid())
		if err != nil {
			t.Fatalf("agent memory: %v", err)
		}
		cpu, err := testenv.ReadProcCPU(a.Pid())
		if err != nil {
			t.Fatalf("agent cpu: %v", err)
		}
		text, err := metricsText(a)
		if err != nil {
			t.Fatalf("agent metrics: %v", err)
		}
		s := soakSample{At: time.Since(begin), RSS: m.RSS, Anon: m.Anon, File: m.File, AgentCPU: cpu,
			HeapInuse: metricSum(text, "go_memstats_heap_inuse_bytes"), HeapAlloc: metricSum(text, "go_memstats_heap_alloc_bytes"),
			FDs: metricSum(text, "process_open_fds"), Goroutines: metricSum(text, "go_goroutines"),
			Deletions: metricSum(text, "gcagent_projection_regret_deletions"),
			Imported:  load.imported.Load(), Ran: load.ran.Load(), Links: load.linked.Load(), Stored: streamMsgs(t, nc)}
		imgs, err := c.Client.ImageService().List(c.Ctx(), `name~="^soak.test/img-"`)
		if err != nil {
			t.Fatalf("list images: %v", err)
		}
		s.ImagesGone = s.Imported - int64(len(imgs))
		ctrs, err := c.Client.ContainerService().List(c.Ctx())
		if err != nil {
			t.Fatalf("list containers: %v", err)
		}
		s.ContainersGone = s.Ran - int64(countPrefixed(ctrs, "soak-c-")) // not the pod's sandbox
		left, err := os.ReadDir(c.LogDir)
		if err != nil {
			t.Fatal(err)
		}
		s.LinksGone = max(0, s.Links-int64(len(left))) // a link made since the count is not yet gone
		samples = append(samples, s)
		if profile && (len(samples) == 2 || ctx.Err() != nil) {
			soakHeap(t, a, filepath.Join(out, fmt.Sprintf("soak-%s-heap-%02d.pb.gz", v, len(samples)-1)))
		}
		t.Logf("%s: minute %d: rss %.1f MiB (anon %.1f, file %.1f), heap in use %.1f MiB, %v fds, %v goroutines; %d images imported, %d gone; %d containers run, %d gone; %d links, %d gone; %d events stored",
			v, len(samples)-1, mib(s.RSS), mib(s.Anon), mib(s.File), s.HeapInuse/(1<<20), s.FDs, s.Goroutines,
			s.Imported, s.ImagesGone, s.Ran, s.ContainersGone, s.Links, s.LinksGone, s.Stored)
	}
	sample()
	minute := time.NewTicker(time.Minute)
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-minute.C:
			sample()
		}
	}
	minute.Stop()
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatalf("load on containerd %s: %v", v, err)
	}
	for _, id := range load.interrupted {
		if err := soakRemove(c, id); err != nil {
			t.Fatalf("remove %s, cut short by the end of the load: %v", id, err)
		}
	}
	// The pod goes, as the kubelet removes a deleted pod's sandbox: its
	// dir is an orphan the agent collects too.
	if _, err := rt.StopPodSandbox(c.Ctx(), &runtime.StopPodSandboxRequest{PodSandboxId: node.SandboxID}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.RemovePodSandbox(c.Ctx(), &runtime.RemovePodSandboxRequest{PodSandboxId: node.SandboxID}); err != nil {
		t.Fatal(err)
	}
	load.add(&load.podDirs, filepath.Base(node.LogDir))

	// The agent catches up: every link and container gone, the disk back
	// under the high threshold, the outbox empty.
	var (
		evs     []storedEvent
		present map[string]bool // image names in containerd when evs were read
	)
	testenv.Eventually(t, 5*time.Minute, func() string {
		left, err := os.ReadDir(c.LogDir)
		if err != nil {
			return err.Error()
		}
		ctrs, err := c.Client.ContainerService().List(c.Ctx())
		if err != nil {
			return err.Error()
		}
		pods, err := os.ReadDir(c.PodLogDir)
		if err != nil {
			return err.Error()
		}
		switch {
		case len(left) > 0:
			return fmt.Sprintf("%d links left", len(left))
		case len(pods) > 0:
			return fmt.Sprintf("%d pod dirs left", len(pods))
		case len(ctrs) > 0:
			return fmt.Sprintf("%d containers left", len(ctrs))
		case usagePercent(t, c.Root) >= high:
			return fmt.Sprintf("disk at %d%%, high threshold %d%%", usagePercent(t, c.Root), high)
		}
		// Image GC may still delete down to the low threshold: the images
		// and the stream are read as one picture only when no delete fell
		// between the two reads of the images.
		before := imageNames(t, c)
		var why string
		if evs, why = deliveredStream(t, a, nc); why != "" {
			return why
		}
		if present = imageNames(t, c); !maps.Equal(before, present) {
			return "images deleted while the stream was read"
		}
		return ""
	})
	sample()
	soakCheck(t, &load, evs, present)
	soakWrite(t, out, v, d, samples)
	if b, err := os.ReadFile(a.LogFile); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"component":"memory"`) && strings.Contains(l, `"level":"info"`) {
				t.Logf("%s: agent: %s", v, l)
			}
		}
	}
}

// countPrefixed counts the containers whose id starts with prefix.
func countPrefixed(ctrs []containers.Container, prefix string) int {
	n := 0
	for _, c := range ctrs {
		if strings.HasPrefix(c.ID, prefix) {
			n++
		}
	}
	return n
}

// imageNames is the set of image names in containerd now.
func imageNames(t *testing.T, c *testenv.Containerd) map[string]bool {
	imgs, err := c.Client.ImageService().List(c.Ctx())
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool, len(imgs))
	for _, img := range imgs {
		names[img.Name] = true
	}
	return names
}

// soakHeap saves the agent's heap profile (--profiling) into path.
func soakHeap(t *testing.T, a *testenv.Agent, path string) {
	code, body, err := a.GetText("/debug/pprof/heap?gc=1")
	if err != nil || code != 200 {
		t.Fatalf("heap profile: %d %v", code, err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// soakRemove removes container id, its task and snapshot, if still there.
func soakRemove(c *testenv.Containerd, id string) error {
	ctr, err := c.Client.LoadContainer(c.Ctx(), id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if task, err := ctr.Task(c.Ctx(), nil); err == nil {
		if _, err := task.Delete(c.Ctx(), client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	if err := ctr.Delete(c.Ctx(), client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// soakImport imports img and unpacks it under one lease, as a pull does.
func soakImport(ctx context.Context, c *testenv.Containerd, img testenv.Image) error {
	ctx, done, err := c.Client.WithLease(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	var buf bytes.Buffer
	if err := testenv.Archive(&buf, img); err != nil {
		return err
	}
	recs, err := c.Client.Import(ctx, &buf)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := client.NewImage(c.Client, r).Unpack(ctx, ""); err != nil {
			return err
		}
	}
	return nil
}

// soakRun runs `true` in a new plain container id (as testenv's
// CreateNative makes one) and waits for its exit; collect deletes the task,
// as its owner would. created says whether the container was.
func soakRun(ctx context.Context, c *testenv.Containerd, id string, collect bool) (created bool, err error) {
	img, err := c.Client.GetImage(ctx, "soak.test/run:1")
	if err != nil {
		return false, err
	}
	ctr, err := c.Client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithNewSnapshot(id, img),
		client.WithRuntime("io.containerd.runc.v2", &runcoptions.Options{Root: filepath.Join(c.Dir, "runc")}),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("true"), oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithCgroup("/"+filepath.Base(c.Dir)+"/"+id)))
	if err != nil {
		return false, err
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		return true, err
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return true, err
	}
	if err := task.Start(ctx); err != nil {
		return true, err
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return true, ctx.Err()
	}
	if collect {
		_, err = task.Delete(ctx)
	}
	return true, err
}

// streamMsgs is how many messages the events stream holds (0 before it
// exists).
func streamMsgs(t *testing.T, nc *nats.Conn) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, natsbus.DefaultStream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// soakCheck checks exactly once: every image, container and link the load
// made that is gone is one removal stored once, and every removal stored
// is of one of them (the runnable image is kept).
func soakCheck(t *testing.T, load *soakLoad, evs []storedEvent, present map[string]bool) {
	checkContract(t, evs)
	imageRemovals, containerRemovals, linkRemovals, podDirRemovals := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	for _, ev := range evs {
		var d struct {
			Names []string `json:"names"`
			Name  string   `json:"name"`
			Kind  string   `json:"kind"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatalf("%s: %v", ev.Type, err)
		}
		switch {
		case ev.KindAction == "image.removed":
			for _, n := range d.Names {
				if !strings.HasPrefix(n, "sha256:") {
					imageRemovals[n]++
				}
			}
		case ev.KindAction == "container.removed":
			containerRemovals[ev.Subject]++
		case ev.KindAction == "log.removed" && d.Kind == "poddir":
			podDirRemovals[d.Name]++
		case ev.KindAction == "log.removed":
			linkRemovals[d.Name]++
		}
	}
	check := func(what string, made []string, gone func(string) bool, removals map[string]int) {
		n := 0
		for _, m := range made {
			switch k := removals[m]; {
			case gone(m) && k != 1:
				t.Errorf("%s %s gone, %d removals stored", what, m, k)
			case !gone(m) && k != 0:
				t.Errorf("%s %s still there, %d removals stored", what, m, k)
			case k == 1:
				n++
			}
			delete(removals, m)
		}
		for m, k := range removals {
			t.Errorf("%s %s not made by the load: %d removals stored", what, m, k)
		}
		t.Logf("%s: %d made, %d removed, each stored once", what, len(made), n)
	}
	load.mu.Lock()
	defer load.mu.Unlock()
	check("image", load.images, func(n string) bool { return !present[n] }, imageRemovals)
	for _, id := range load.interrupted { // removed by the agent, or by the load after it
		if k := containerRemovals[id]; k > 1 {
			t.Errorf("container %s (its run cut short) removed %d times", id, k)
		}
		delete(containerRemovals, id)
	}
	check("container", load.containers, func(string) bool { return true }, containerRemovals) // all gone: checked above
	check("link", load.links, func(string) bool { return true }, linkRemovals)
	check("pod dir", load.podDirs, func(string) bool { return true }, podDirRemovals)
}

// soakWrite writes soak-<v>.csv and soak-<v>.md into dir.
func soakWrite(t *testing.T, dir string, v testenv.Version, d time.Duration, samples []soakSample) {
	var csv strings.Builder
	csv.WriteString("minute,rss_mib,anon_mib,file_mib,heap_inuse_mib,heap_alloc_mib,fds,goroutines,agent_cpu_s,images_imported,images_gone,regret_deletions,containers_run,containers_gone,links,links_gone,events_stored\n")
	for _, s := range samples {
		fmt.Fprintf(&csv, "%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.0f,%.0f,%.1f,%d,%d,%.0f,%d,%d,%d,%d,%d\n", s.At.Minutes(), mib(s.RSS), mib(s.Anon), mib(s.File),
			s.HeapInuse/(1<<20), s.HeapAlloc/(1<<20), s.FDs, s.Goroutines, s.AgentCPU.Seconds(),
			s.Imported, s.ImagesGone, s.Deletions, s.Ran, s.ContainersGone, s.Links, s.LinksGone, s.Stored)
	}
	var md strings.Builder
	step := 10 // rows by ten minutes; by minute for a soak under an hour
	if d < time.Hour {
		step = 1
	}
	fmt.Fprintf(&md, "Soak of %s on containerd %s (`make soak SOAK=%s`), one row by %d minutes (the last: after the load stopped and the agent caught up):\n\n",
		d, v, os.Getenv("GCAGENT_TEST_SOAK"), step)
	md.WriteString("| minute | RSS MiB (anon, file) | Go heap in use MiB | fds | goroutines | images imported / gone (deletions held for regrets) | containers run / gone | links / gone | events stored |\n")
	md.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range samples {
		if i%step != 0 && i != len(samples)-1 {
			continue
		}
		fmt.Fprintf(&md, "| %.0f | %.1f (%.1f, %.1f) | %.1f | %.0f | %.0f | %d / %d (%.0f) | %d / %d | %d / %d | %d |\n", s.At.Minutes(), mib(s.RSS), mib(s.Anon), mib(s.File),
			s.HeapInuse/(1<<20), s.FDs, s.Goroutines, s.Imported, s.ImagesGone, s.Deletions, s.Ran, s.ContainersGone, s.Links, s.LinksGone, s.Stored)
	}
	md.WriteString("\n" + soakVerdict(samples) + "\n")
	for name, body := range map[string]string{"csv": csv.String(), "md": md.String()} {
		path := filepath.Join(dir, fmt.Sprintf("soak-%s.%s", v, name))
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
	}
	t.Logf("%s: %s", v, soakVerdict(samples))
}

// soakVerdict says whether resident memory plateaus: the mean RSS of the
// last third of the minutes under load against the middle third's (the
// first third holds the start and the first GC passes), the same for the
// Go heap, file descriptors and goroutines.
func soakVerdict(samples []soakSample) string {
	load := samples[:len(samples)-1] // the last sample is after the load
	if len(load) < 6 {
		return "Too short to say whether memory plateaus (under six minutes of load)."
	}
	third := len(load) / 3
	mid, last := load[third:2*third], load[2*third:]
	mean := func(ss []soakSample, f func(soakSample) float64) float64 {
		var sum float64
		for _, s := range ss {
			sum += f(s)
		}
		return sum / float64(len(ss))
	}
	rss := func(s soakSample) float64 { return mib(s.RSS) }
	heap := func(s soakSample) float64 { return s.HeapInuse / (1 << 20) }
	hours := (last[len(last)-1].At - mid[0].At).Hours() / 2 // between the thirds' middles, about
	grow := (mean(last, rss) - mean(mid, rss)) / math.Max(hours, 1.0/60)
	verdict := "plateaus"
	if mean(last, rss)-mean(mid, rss) > math.Max(1, 0.03*mean(mid, rss)) {
		verdict = fmt.Sprintf("grows, about %.1f MiB an hour", grow)
	}
	maxOf := func(f func(soakSample) float64) float64 {
		m := 0.0
		for _, s := range load {
			m = max(m, f(s))
		}
		return m
	}
	return fmt.Sprintf("Resident memory %s: mean %.1f MiB over minutes %.0f-%.0f, %.1f MiB over minutes %.0f-%.0f (Go heap in use %.1f and %.1f MiB); "+
		"file descriptors at most %.0f, goroutines at most %.0f; images deleted and remembered for their 24 h regret window %.0f at minute %.0f, %.0f at minute %.0f.",
		verdict, mean(mid, rss), mid[0].At.Minutes(), mid[len(mid)-1].At.Minutes(), mean(last, rss), last[0].At.Minutes(), last[len(last)-1].At.Minutes(),
		mean(mid, heap), mean(last, heap), maxOf(func(s soakSample) float64 { return s.FDs }), maxOf(func(s soakSample) float64 { return s.Goroutines }),
		mid[0].Deletions, mid[0].At.Minutes(), last[len(last)-1].Deletions, last[len(last)-1].At.Minutes())
}
