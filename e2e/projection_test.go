// Package e2e runs the gcagent binary against real containerd daemons,
// CRI pods and NATS, and checks what it sees and does against ground truth
// read from those components directly.
package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/usage"
	"github.com/containerd/platforms"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// projected renders the agent's report in the shape of testenv.Truth.
func projected(rep projection.Report) testenv.Truth {
	tr := testenv.Truth{Images: map[string][]string{}, Containers: map[string]testenv.TruthContainer{}, LivePods: []string{}}
	for _, img := range rep.Images {
		tr.Images[img.Digest] = img.Names
	}
	for _, c := range rep.Containers {
		tc := testenv.TruthContainer{Image: c.Image, Kind: c.Kind, State: c.State.String()}
		if c.State == projection.StateExited {
			tc.ExitStatus = c.ExitStatus
		}
		tr.Containers[c.ID] = tc
	}
	for _, p := range rep.Pods {
		if p.Alive {
			tr.LivePods = append(tr.LivePods, p.UID)
		}
	}
	return tr
}

// converge waits until the agent's projection equals ground truth, and
// checks that each container is a user of the image its name points at.
func converge(t *testing.T, c *testenv.Containerd, a *testenv.Agent) projection.Report {
	t.Helper()
	var rep projection.Report
	testenv.Eventually(t, 30*time.Second, func() string {
		rep = projection.Report{}
		if code, err := a.Get("/status", &rep); err != nil || code != 200 {
			return fmt.Sprintf("status: %d %v", code, err)
		}
		if !rep.Synced {
			return "not synced"
		}
		got, want := projected(rep), c.Truth(t)
		// A 2.x daemon reaps stopped native tasks when it restarts, so
		// containerd cannot tell such a container from one never started.
		for id, w := range want.Containers {
			if g, ok := got.Containers[id]; ok && w.State == "no-task" && (g.State == "created" || g.State == "exited") {
				g.State, g.ExitStatus = "no-task", 0
				got.Containers[id] = g
			}
		}
		if !reflect.DeepEqual(got, want) {
			return "projection differs from containerd:" + truthDiff(got, want)
		}
		return ""
	})
	users := map[string][]string{}
	for _, img := range rep.Images {
		for _, n := range img.Names {
			users[n] = img.Users
		}
	}
	for _, ct := range rep.Containers {
		if u, ok := users[ct.Image]; ok && !slices.Contains(u, ct.ID) {
			t.Errorf("container %s is not a user of its image %s (users %v)", ct.ID, ct.Image, u)
		}
	}
	return rep
}

// workload drives a scripted mix: imports with a shared base layer, a retag,
// a moved name, native containers running, exited, never started and
// deleted, a CRI pod with two containers (one exits), an image delete.
type workload struct {
	t   *testing.T
	c   *testenv.Containerd
	rt  runtime.RuntimeServiceClient
	pod *testenv.Pod
}

func newWorkload(t *testing.T, c *testenv.Containerd) *workload {
	rt, _ := c.CRI(t)
	return &workload{t: t, c: c, rt: rt}
}

func (w *workload) partA() {
	t, c := w.t, w.c
	base := testenv.Layer{Seed: "base", Size: 256 << 10}
	c.Import(t,
		testenv.Runnable("example.test/app:1", base, testenv.Layer{Seed: "app", Size: 64 << 10}),
		testenv.Runnable("example.test/tool:1", base, testenv.Layer{Seed: "tool", Size: 64 << 10}),
		testenv.Image{Name: "example.test/data:1", Layers: []testenv.Layer{{Seed: "data", Size: 128 << 10}}},
		testenv.Image{Name: "example.test/idle:1", Layers: []testenv.Layer{{Seed: "idle", Size: 16 << 10}}},
		testenv.Pause(c.SandboxImage),
	)
	w.tag("example.test/app:1", "example.test/app:latest")
	w.tag("example.test/data:1", "example.test/moving:1")
	c.RunNative(t, "n-running", "example.test/app:1", "sleep", "600")
	exited := c.RunNative(t, "n-exited", "example.test/tool:1", "sh", "-c", "exit 3")
	c.WaitExit(t, exited)
	c.CreateNative(t, "n-created", "example.test/app:latest", "true")
	w.pod = c.RunPod(t, w.rt, "web", "default", "0d6f7c1e-uid-web")
	c.RunPodContainer(t, w.rt, w.pod, "app", "example.test/app:1", "sleep", "600")
}

func (w *workload) partB() {
	t, c := w.t, w.c
	gone := c.RunNative(t, "n-gone", "example.test/tool:1", "true")
	c.WaitExit(t, gone)
	c.DeleteNative(t, gone)
	w.tag("example.test/tool:1", "example.test/moving:1") // move a name to another target
	id := c.RunPodContainer(t, w.rt, w.pod, "job", "example.test/tool:1", "sh", "-c", "exit 2")
	testenv.Eventually(t, 20*time.Second, func() string {
		resp, err := w.rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil || resp.Status.State != runtime.ContainerState_CONTAINER_EXITED {
			return fmt.Sprintf("job not exited: %v", err)
		}
		return ""
	})
	if err := c.Client.ImageService().Delete(c.Ctx(), "example.test/data:1", images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	c.Import(t, testenv.Image{Name: "example.test/late:1", Layers: []testenv.Layer{{Seed: "late", Size: 32 << 10}}})
}

// tag points name at from's target, creating or moving it.
func (w *workload) tag(from, name string) {
	ctx := w.c.Ctx()
	src, err := w.c.Client.ImageService().Get(ctx, from)
	if err != nil {
		w.t.Fatal(err)
	}
	img := images.Image{Name: name, Target: src.Target}
	if _, err := w.c.Client.ImageService().Update(ctx, img, "target"); err != nil {
		if _, err := w.c.Client.ImageService().Create(ctx, img); err != nil {
			w.t.Fatalf("tag %s: %v", name, err)
		}
	}
}

// truthDiff lists the entries that differ, for a readable failure.
func truthDiff(got, want testenv.Truth) string {
	var b strings.Builder
	for d, names := range want.Images {
		if g := got.Images[d]; !reflect.DeepEqual(g, names) {
			fmt.Fprintf(&b, "\n image %s: got %v want %v", d, g, names)
		}
	}
	for d, names := range got.Images {
		if _, ok := want.Images[d]; !ok {
			fmt.Fprintf(&b, "\n image %s: got %v, not in containerd", d, names)
		}
	}
	for id, w := range want.Containers {
		if g, ok := got.Containers[id]; !ok || g != w {
			fmt.Fprintf(&b, "\n container %s: got %+v (known %v) want %+v", id, g, ok, w)
		}
	}
	for id, g := range got.Containers {
		if _, ok := want.Containers[id]; !ok {
			fmt.Fprintf(&b, "\n container %s: got %+v, not in containerd", id, g)
		}
	}
	if !reflect.DeepEqual(got.LivePods, want.LivePods) {
		fmt.Fprintf(&b, "\n live pods: got %v want %v", got.LivePods, want.LivePods)
	}
	return b.String()
}

// observeOnly makes an agent that deletes nothing, so that the scripted
// workload alone decides what exists.
var observeOnly = []string{"--prune-containers=off", "--image-gc-high-threshold=100"}

// forEachVersion runs fn once per daemon (testenv.Versions), each in a
// subtest named containerd-<version>. The subtests run in parallel with
// each other, and, in a test that called t.Parallel, with the package's
// other parallel tests (at most go test -parallel at once).
func forEachVersion(t *testing.T, fn func(t *testing.T, v testenv.Version)) {
	for _, v := range testenv.Versions() {
		t.Run("containerd-"+string(v), func(t *testing.T) { t.Parallel(); fn(t, v) })
	}
}

// TestProjectionMatchesContainerd: the agent follows a scripted workload
// and its projection equals what containerd and CRI list.
func TestProjectionMatchesContainerd(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), observeOnly...)
		w := newWorkload(t, c)
		w.partA()
		rep := converge(t, c, a)
		if n := len(rep.Pods); n != 1 {
			t.Fatalf("pods: %d", n)
		}
		w.partB()
		rep = converge(t, c, a)
		labelled := 0      // images whose manifest names its layers (facts from labels)
		var fetched string // the config of one of them
		for _, img := range rep.Images {
			if slices.Contains(img.Names, "example.test/late:1") && img.Size <= 32<<10 {
				t.Errorf("late image size %d, want more than its 32 KiB layer", img.Size)
			}
			// The ids the agent took from the unpacker's labels where it
			// could are those of the image's config, read here.
			ci, err := c.Client.GetImage(c.Ctx(), img.Names[0])
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := ci.Config(c.Ctx())
			if err != nil {
				t.Fatal(err)
			}
			diffIDs, err := ci.RootFS(c.Ctx())
			if err != nil {
				t.Fatal(err)
			}
			chain := identity.ChainID(diffIDs).String()
			if img.ID != cfg.Digest.String() || img.ChainID != chain {
				t.Errorf("image %v: id %s chain %s, want %s and %s", img.Names, img.ID, img.ChainID, cfg.Digest, chain)
			}
			// The size the agent took from labels where it could is the
			// kubelet's: containerd's own walk over the image's blobs.
			size, err := usage.CalculateImageUsage(c.Ctx(), ci.Metadata(), c.Client.ContentStore(),
				usage.WithManifestLimit(platforms.Default(), 1), usage.WithManifestUsage())
			if err != nil || img.Size != size {
				t.Errorf("image %v: size %d, want %d (%v)", img.Names, img.Size, size, err)
			}
			if mi, err := c.Client.ContentStore().Info(c.Ctx(), ci.Target().Digest); err == nil && mi.Labels["containerd.io/gc.ref.content.l.0"] != "" {
				labelled++
				fetched = img.ID
			}
			// What the agent relies on: unpacking labels the config so.
			info, err := c.Client.ContentStore().Info(c.Ctx(), cfg.Digest)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Labels["containerd.io/gc.ref.snapshot.overlayfs"]; got != chain {
				t.Errorf("image %v: config labelled with chain %q, want %s", img.Names, got, chain)
			}
		}
		t.Logf("%d of %d images have manifests that name their layers", labelled, len(rep.Images))
		if code, _ := a.Get("/readyz", nil); code != 200 {
			t.Errorf("/readyz = %d after sync", code)
		}
		// Those facts came with each image's event, read from its blobs. An
		// agent that starts on them (empty state) takes them from one
		// listing of the content store's labels: the same facts.
		if labelled == 0 {
			t.Fatal("no image for the first listing to take from labels")
		}
		// One image as a pull that does not unpack leaves it (`ctr content
		// fetch`, buildkit): its config without the unpacker's label, so
		// that the listing reads its config for the chain.
		if _, err := c.Client.ContentStore().Update(c.Ctx(), content.Info{Digest: digest.Digest(fetched)},
			"labels.containerd.io/gc.ref.snapshot.overlayfs"); err != nil {
			t.Fatal(err)
		}
		a.Stop()
		fresh := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "fresh"), observeOnly...)
		listed := converge(t, c, fresh)
		type facts struct {
			size      int64
			id, chain string
		}
		byDigest := map[string]facts{}
		for _, img := range rep.Images {
			byDigest[img.Digest] = facts{img.Size, img.ID, img.ChainID}
		}
		for _, img := range listed.Images {
			if got, want := (facts{img.Size, img.ID, img.ChainID}), byDigest[img.Digest]; got != want {
				t.Errorf("image %v listed with %+v, from its event %+v", img.Names, got, want)
			}
		}
	})
}

// TestProjectionRepairedAfterContainerdRestart: events lost while
// containerd is down (a container killed behind its back) and changes made
// right after it returns are repaired by the resync on reconnect.
func TestProjectionRepairedAfterContainerdRestart(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), observeOnly...)
		w := newWorkload(t, c)
		w.partA()
		converge(t, c, a)

		victim := c.RunNative(t, "n-victim", "example.test/app:1", "sleep", "600")
		task, err := victim.Task(c.Ctx(), nil)
		if err != nil {
			t.Fatal(err)
		}
		pid := int(task.Pid())
		converge(t, c, a)
		c.Stop()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil { // its exit event has nowhere to go
			t.Fatal(err)
		}
		// Down until an attempt to reconnect has failed: it is not counted
		// as a subscription lost.
		testenv.Eventually(t, 30*time.Second, func() string {
			if strings.Contains(a.LogTail(200), "containerd version: ") {
				return ""
			}
			return "no failed attempt to reconnect logged"
		})
		c.Restart()
		w.partB()
		rep := converge(t, c, a)
		for _, ct := range rep.Containers {
			if ct.ID == "n-victim" && ct.State != projection.StateExited {
				t.Fatalf("victim is %s after restart", ct.State)
			}
		}
		if m := mustMetrics(t, a); !strings.Contains(m, "gcagent_events_reconnects_total 1\n") {
			t.Errorf("want exactly one subscription lost in metrics, got %v", metricSum(m, "gcagent_events_reconnects_total"))
		}
	})
}

// TestProjectionSurvivesKill9: after kill -9 and a restart on the same
// state dir, first-seen and last-used times of images untouched meanwhile
// are exactly what they were, and what happened while the agent was down is
// picked up.
func TestProjectionSurvivesKill9(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, observeOnly...)
		w := newWorkload(t, c)
		w.partA()
		// Give an image a last-used time: a container comes and goes. The
		// agent must see it come (a create it looks up after the delete is
		// skipped) and go, before the kill: the projection equals
		// containerd's truth before, in between and after.
		brief := c.CreateNative(t, "n-brief", "example.test/idle:1", "true")
		waitProjected(t, a, func(rep projection.Report) bool {
			return slices.ContainsFunc(rep.Containers, func(ct projection.ContainerReport) bool { return ct.ID == "n-brief" })
		}, "n-brief not in the projection")
		c.DeleteNative(t, brief)
		waitProjected(t, a, func(rep projection.Report) bool {
			return slices.ContainsFunc(rep.Images, func(img projection.ImageReport) bool {
				return slices.Contains(img.Names, "example.test/idle:1") && !img.LastUsed.IsZero() && len(img.Users) == 0
			})
		}, "idle:1 has no last-used time yet")
		before := converge(t, c, a)
		a.Kill()

		killedAt := time.Now().UTC()
		w.partB() // while the agent is down
		a2 := testenv.StartAgent(t, c, state, observeOnly...)
		after := converge(t, c, a2)

		old := map[string]projection.ImageReport{}
		for _, img := range before.Images {
			old[img.Digest] = img
		}
		carried := 0
		for _, img := range after.Images {
			prev, ok := old[img.Digest]
			if !ok {
				if img.FirstSeen.Before(killedAt) {
					t.Errorf("new image %v first seen %v, before the kill at %v", img.Names, img.FirstSeen, killedAt)
				}
				continue
			}
			carried++
			if !prev.FirstSeen.Equal(img.FirstSeen) {
				t.Errorf("image %v first seen %v, was %v", img.Names, img.FirstSeen, prev.FirstSeen)
			}
			if len(img.Users) == 0 && len(prev.Users) == 0 && !prev.LastUsed.Equal(img.LastUsed) {
				t.Errorf("image %v last used %v, was %v", img.Names, img.LastUsed, prev.LastUsed)
			}
			if slices.Contains(img.Names, "example.test/idle:1") && img.LastUsed.IsZero() {
				t.Errorf("idle image lost its last-used time")
			}
		}
		if carried < 4 {
			t.Fatalf("only %d images carried over the kill; the test proves nothing", carried)
		}
	})
}

// waitProjected waits until ok holds for the agent's projection.
func waitProjected(t *testing.T, a *testenv.Agent, ok func(projection.Report) bool, why string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() string {
		var rep projection.Report
		if code, err := a.Get("/status", &rep); err != nil || code != 200 {
			return fmt.Sprintf("status: %d %v", code, err)
		}
		if !ok(rep) {
			return why
		}
		return ""
	})
}

func mustMetrics(t *testing.T, a *testenv.Agent) string {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestPeriodicResync: listings repeat on their own, jittered around
// --resync-interval, and a listing that finds nothing new applies exactly
// one event, its Synced marker.
func TestPeriodicResync(t *testing.T) {
	t.Parallel()
	c := testenv.StartContainerd(t, testenv.Options{Version: testenv.Versions()[0]})
	a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), append(observeOnly, "--resync-interval=1s")...)
	c.Import(t, testenv.Image{Name: "example.test/one:1", Layers: []testenv.Layer{{Seed: "one", Size: 1024}}})
	first := converge(t, c, a)
	listings0 := listings(t, a)
	testenv.Eventually(t, 10*time.Second, func() string {
		if n := listings(t, a) - listings0; n < 3 {
			return fmt.Sprintf("%d periodic listings so far", n)
		}
		return ""
	})
	var rep projection.Report
	if _, err := a.Get("/status", &rep); err != nil {
		t.Fatal(err)
	}
	n := listings(t, a) - listings0
	// A listing may be in flight between the two reads: allow one.
	if d := int(rep.Seq - first.Seq); d < n-1 || d > n {
		t.Errorf("%d idle listings applied %d events, want one Synced marker each", n, d)
	}
}

// listings sums gcagent_events_listings_total over its reasons.
func listings(t *testing.T, a *testenv.Agent) int {
	total := 0
	for _, l := range strings.Split(mustMetrics(t, a), "\n") {
		if strings.HasPrefix(l, "gcagent_events_listings_total{") {
			f := strings.Fields(l)
			v, _ := strconv.Atoi(f[len(f)-1])
			total += v
		}
	}
	return total
}
