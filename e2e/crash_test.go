package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// deleteLog records containerd's own /images/delete and /containers/delete
// events: the truth of what was removed, whoever removed it.
type deleteLog struct {
	mu         sync.Mutex
	images     map[string]int // image name -> deletes seen
	containers map[string]int // container id -> deletes seen
	broken     error          // the subscription ended
	seen       int            // events received
}

func recordDeletes(t testing.TB, c *testenv.Containerd) *deleteLog {
	t.Helper()
	d := &deleteLog{images: map[string]int{}, containers: map[string]int{}}
	followEvents(t, c, func(_ *cdevents.Envelope, v any) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.seen++
		switch e := v.(type) {
		case *apievents.ImageDelete:
			d.images[e.Name]++
		case *apievents.ContainerDelete:
			d.containers[e.ID]++
		}
	}, func(err error) {
		// A broken subscription would make the comparison meaningless:
		// the settle loop reports it.
		d.mu.Lock()
		d.broken = err
		d.mu.Unlock()
	})
	return d
}

func (d *deleteLog) snapshot() (images, containers map[string]int, broken error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	images, containers = map[string]int{}, map[string]int{}
	for k, v := range d.images {
		images[k] = v
	}
	for k, v := range d.containers {
		containers[k] = v
	}
	return images, containers, d.broken
}

// crashSeed is GCAGENT_TEST_CRASH_SEED or the clock; the test prints it so a
// failing order of kills can be replayed.
func crashSeed(t *testing.T) uint64 {
	if s := os.Getenv("GCAGENT_TEST_CRASH_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GCAGENT_TEST_CRASH_SEED %q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

func crashIterations(t *testing.T) int {
	if s := os.Getenv("GCAGENT_TEST_CRASH_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("GCAGENT_TEST_CRASH_ITERATIONS %q", s)
		}
		return n
	}
	return 50
}

// TestCrashConsistency: on each daemon, the agent is started and SIGKILLed
// 50 times on one state dir, at a random moment (seeded; the seed is
// logged, GCAGENT_TEST_CRASH_SEED replays it) while it works: each iteration
// adds two unused images under lasting disk pressure, two plain containers
// that exit, a dangling log symlink and, every fifth time, an orphaned pod
// log dir, in a random order, either while the agent is down or while it
// runs, with the kill right after the work or around the containers'
// eligibility, so kills land in startup, listing, intent resolution and
// the middle of image, container and log passes. Right before each kill
// the test reads /status: what it shows (each image's first-seen time)
// must survive the kill. Then the agent runs once more and settles.
// Afterwards: nothing protected (a running plain container and a running
// pod container with their image, a pinned image, two images kept by a
// pattern, the sandbox image, the live pod's sandbox and log dir, a live
// log link) was deleted; the projection equals containerd's truth and kept
// every first-seen time; every image and container containerd reports
// deleted (its own /images/delete and /containers/delete events; the test
// deletes nothing itself) and every log entry removed has exactly one
// removal event in the stream, no removal event names an object that was
// not removed, every event id is stored once, and every agent that
// answered /status has its agent.started event.
func TestCrashConsistency(t *testing.T) {
	t.Parallel()
	seed := crashSeed(t)
	n := crashIterations(t)
	t.Logf("seed %d (GCAGENT_TEST_CRASH_SEED=%d replays it), %d iterations per daemon", seed, seed, n)
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		testCrashConsistency(t, v, rand.New(rand.NewPCG(seed, uint64(v[0])<<8|uint64(v[len(v)-1]))), n)
	})
}

func testCrashConsistency(t *testing.T, v testenv.Version, rng *rand.Rand, iterations int) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
	ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	nc := natsConn(t, ns.ClientURL())
	deletes := recordDeletes(t, c)
	rt, _ := c.CRI(t)

	// Protected objects.
	ids := map[string]string{} // image name -> image id (config digest)
	protected := []testenv.Image{
		testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/run:1", testenv.Layer{Seed: "crash-run", Size: 1 << 20}),
		testenv.Runnable("example.test/pinned:1", testenv.Layer{Seed: "crash-pinned", Size: 1 << 20}),
		testenv.Runnable("keep.test/tools:1", testenv.Layer{Seed: "crash-keep", Size: 1 << 20}),
		testenv.Runnable("keep.test/job:1", testenv.Layer{Seed: "crash-job", Size: 256 << 10}), // the dead containers' image
	}
	maps.Copy(ids, imageIDs(t, protected...))
	recs := c.Import(t, protected...)
	// CRI adds a second name to each image, its id (the config digest):
	// containerd reports the delete of each name. The id is read from the
	// archive, as the agent may delete an unused image right after its import.
	alias := map[string]string{} // image id name -> target digest
	addAlias := func(name, digest string) {
		alias[ids[name]] = digest
	}
	protectedImages := map[string]string{} // name -> digest
	for _, r := range recs {
		protectedImages[r.Name] = r.Target.Digest.String()
		addAlias(r.Name, r.Target.Digest.String())
	}
	pinned, err := c.Client.ImageService().Get(c.Ctx(), "example.test/pinned:1")
	if err != nil {
		t.Fatal(err)
	}
	pinned.Labels = map[string]string{projection.LabelPinned: projection.LabelPinnedValue}
	if _, err := c.Client.ImageService().Update(c.Ctx(), pinned, "labels"); err != nil {
		t.Fatal(err)
	}
	c.RunNative(t, "p-running", "example.test/run:1", "sleep", "600")
	pod := c.RunPod(t, rt, "live", "default", "c0ffee00-uid-live")
	podCtr := c.RunPodContainer(t, rt, pod, "app", "example.test/run:1", "sleep", "600")
	liveTarget := filepath.Join(c.Dir, "live-target.log")
	mustWrite(t, liveTarget, "alive\n")
	liveLink := filepath.Join(c.LogDir, "other_default_app-aaaaaaaaaaaaaaaa.log")
	mustSymlink(t, liveTarget, liveLink)
	protectedContainers := []string{"p-running", podCtr, pod.SandboxID}
	protectedPaths := []string{pod.LogDir, liveLink, liveTarget}

	// The recorder is live before anything can be deleted.
	testenv.Eventually(t, 10*time.Second, func() string {
		d := deletes
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.seen == 0 {
			return "no containerd event recorded yet"
		}
		return ""
	})

	// Lasting disk pressure: usage stays above the high threshold (1%) and
	// cannot reach the low one (0%), so each image that becomes eligible
	// goes in the next pass.
	if u := usagePercent(t, c.Root); u < 2 {
		t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
	}
	state := filepath.Join(t.TempDir(), "state")
	flags := []string{"--nats-url", ns.ClientURL(),
		"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s",
		"--keep-image", "keep.test/*", "--disk-interval", "200ms",
		"--uncollected-exit-grace", "1s", "--pod-log-grace", "1s", "--log-level", "info"}

	junk := map[string]string{} // name -> digest of every unprotected image imported
	var dead []string           // unprotected containers
	var logPaths []string       // dangling links and orphaned pod dirs
	// work adds two unused images, two plain containers that exit and a
	// dangling log symlink (and every fifth time an orphaned pod log dir),
	// in a random order, so that what is made last, right before a kill,
	// varies.
	work := func(i int) {
		steps := []func(){
			func() {
				// Bound what waits: a run of early kills must not fill the tmpfs.
				pending := 0
				for name := range junk {
					if !imageGone(t, c, name) {
						pending++
					}
				}
				if pending >= 12 {
					return
				}
				var imgs []testenv.Image
				for k := range 2 {
					name := fmt.Sprintf("example.test/junk-%d-%d:1", i, k)
					imgs = append(imgs, testenv.Image{Name: name, Layers: []testenv.Layer{{Seed: fmt.Sprintf("crash-%s-junk-%d-%d", v, i, k), Size: 1 << 20}}})
				}
				maps.Copy(ids, imageIDs(t, imgs...))
				for _, r := range c.ImportLeased(t, imgs...) {
					junk[r.Name] = r.Target.Digest.String()
					addAlias(r.Name, junk[r.Name])
				}
			},
			func() {
				for k := range 2 {
					id := fmt.Sprintf("dead-%d-%d", i, k)
					c.RunNative(t, id, "keep.test/job:1", "true")
					dead = append(dead, id)
				}
			},
			func() {
				logPaths = append(logPaths, danglingLog(t, c, fmt.Sprintf("crash%d", i), fmt.Sprintf("%016x", 0xdead0000+i)))
				if i%5 == 0 {
					dir := filepath.Join(c.PodLogDir, fmt.Sprintf("default_gone%d_%08d-uid", i, i))
					mustWrite(t, filepath.Join(dir, "app", "0.log"), "bye\n")
					logPaths = append(logPaths, dir)
				}
			},
		}
		rng.Shuffle(len(steps), func(a, b int) { steps[a], steps[b] = steps[b], steps[a] })
		for _, step := range steps {
			step()
		}
	}

	// The first kill comes right after the agent showed its projection: the
	// first-seen times it showed must survive this and every later kill
	// (the LRU history a restart keeps).
	firstSeen := map[string]time.Time{} // digest -> first seen
	{
		a := testenv.StartAgent(t, c, state, flags...)
		var rep projection.Report
		testenv.Eventually(t, 30*time.Second, func() string {
			rep = projection.Report{}
			if code, err := a.Get("/status", &rep); err != nil || code != 200 || !rep.Synced {
				return fmt.Sprintf("agent not synced (%d %v)", code, err)
			}
			return ""
		})
		a.Kill()
		for _, img := range rep.Images {
			if slices.Contains(slices.Collect(maps.Values(protectedImages)), img.Digest) {
				firstSeen[img.Digest] = img.FirstSeen
			}
		}
		if len(firstSeen) != len(protectedImages) {
			t.Fatalf("the first agent showed %d of the %d protected images", len(firstSeen), len(protectedImages))
		}
	}

	start := time.Now()
	var lived []time.Duration
	modes := map[string]int{}
	shown := 0 // kills right after the agent showed a synced projection
	ms := func(n int) time.Duration { return time.Duration(rng.IntN(n)) * time.Millisecond }
	for i := range iterations {
		// The sleeps are the random moment of the kill, not a wait for a result.
		var a *testenv.Agent
		var began time.Time
		startAgent := func() { a, began = testenv.StartAgent(t, c, state, flags...), time.Now() }
		switch mode := rng.IntN(3); mode {
		case 0: // work made while the agent is down: killed during startup, listing or the first passes
			modes["work-while-down"]++
			work(i)
			startAgent()
			time.Sleep(ms(800))
		case 1: // killed right after the work: during the image pass or the log removal it starts
			modes["kill-right-after-work"]++
			startAgent()
			time.Sleep(ms(300))
			work(i)
			time.Sleep(ms(150))
		case 2: // killed around the plain containers' eligibility (exit + 1 s grace)
			modes["kill-near-container-eligibility"]++
			startAgent()
			time.Sleep(ms(300))
			work(i)
			time.Sleep(800*time.Millisecond + ms(700))
		}
		if a.Exited(0) {
			t.Fatalf("iteration %d: the agent exited by itself:\n%s", i, a.LogTail(30))
		}
		// What the agent shows right before the kill must survive it: an
		// image's first-seen time never changes (no digest is imported twice).
		var rep projection.Report
		if code, err := a.Get("/status", &rep); err == nil && code == 200 && rep.Synced {
			shown++
			for _, img := range rep.Images {
				if want, ok := firstSeen[img.Digest]; !ok {
					firstSeen[img.Digest] = img.FirstSeen
				} else if !img.FirstSeen.Equal(want) {
					t.Errorf("iteration %d: image %s %v first seen %v, shown as %v before an earlier kill", i, img.Digest, img.Names, img.FirstSeen, want)
				}
			}
		}
		a.Kill()
		lived = append(lived, time.Since(began))
	}
	t.Logf("kill schedules: %v; %d kills came right after the agent showed a synced projection", modes, shown)
	sort.Slice(lived, func(i, j int) bool { return lived[i] < lived[j] })
	imgs, ctrs, _ := deletes.snapshot()
	t.Logf("%d kills in %s (agent lived %s..%s, median %s); so far containerd deleted %d images, %d containers",
		iterations, time.Since(start).Round(time.Millisecond), lived[0].Round(time.Millisecond),
		lived[len(lived)-1].Round(time.Millisecond), lived[len(lived)/2].Round(time.Millisecond), len(imgs), len(ctrs))

	hits := crashHits(t, state)
	t.Logf("where the kills landed (from the agents' logs): %v", hits)

	// Settle: one more agent finishes the work and delivers every event.
	settle := time.Now()
	a := testenv.StartAgent(t, c, state, flags...)
	natsWaitSynced(t, a)
	var evs []storedEvent
	testenv.Eventually(t, 120*time.Second, func() string {
		imgs, ctrs, broken := deletes.snapshot()
		if broken != nil {
			t.Fatalf("the containerd event subscription broke: %v", broken)
		}
		for name := range junk {
			if !imageGone(t, c, name) {
				return "image " + name + " not removed"
			}
			if imgs[name] == 0 {
				return "no /images/delete seen yet for " + name
			}
		}
		for _, id := range dead {
			if !containerGone(t, c, id) {
				return "container " + id + " not removed"
			}
			if ctrs[id] == 0 {
				return "no /containers/delete seen yet for " + id
			}
		}
		for _, p := range logPaths {
			if exists(p) {
				return p + " not removed"
			}
		}
		var why string
		if evs, why = deliveredStream(t, a, nc); why != "" {
			return why
		}
		removed := func(kindAction string) map[string]int { return subjectsOf(evs, kindAction) }
		for _, d := range junk {
			if removed("image.removed")[d] == 0 {
				return "no image.removed for " + d
			}
		}
		for _, id := range dead {
			if removed("container.removed")[id] == 0 {
				return "no container.removed for " + id
			}
		}
		for _, p := range logPaths {
			if removed("log.removed")[p] == 0 {
				return "no log.removed for " + p
			}
		}
		return ""
	})
	t.Logf("settled in %s", time.Since(settle).Round(time.Millisecond))

	// (1) Nothing protected was deleted.
	imgs, ctrs, _ = deletes.snapshot()
	for name, d := range protectedImages {
		if imgs[name] != 0 || imageGone(t, c, name) {
			t.Errorf("protected image %s (%s) was deleted", name, d)
		}
	}
	for name, d := range alias {
		if imgs[name] != 0 && slices.Contains(slices.Collect(maps.Values(protectedImages)), d) {
			t.Errorf("the id name %s of protected image %s was deleted", name, d)
		}
	}
	for _, id := range protectedContainers {
		if ctrs[id] != 0 || containerGone(t, c, id) {
			t.Errorf("protected container %s was deleted", id)
		}
	}
	tr := c.Truth(t)
	for _, id := range []string{"p-running", podCtr} {
		if tr.Containers[id].State != "running" {
			t.Errorf("protected container %s is %q, not running", id, tr.Containers[id].State)
		}
	}
	for _, p := range protectedPaths {
		if !exists(p) {
			t.Errorf("protected %s was removed", p)
		}
	}
	if resp, err := rt.PodSandboxStatus(c.Ctx(), &runtime.PodSandboxStatusRequest{PodSandboxId: pod.SandboxID}); err != nil ||
		resp.Status.State != runtime.PodSandboxState_SANDBOX_READY {
		t.Errorf("the live pod's sandbox is not ready: %v %v", resp, err)
	}

	// (2) The projection equals containerd's truth, and the history shown
	// before the kills is kept.
	rep := converge(t, c, a)
	for _, img := range rep.Images {
		if want, ok := firstSeen[img.Digest]; ok && !img.FirstSeen.Equal(want) {
			t.Errorf("image %s %v: first seen %v after the kills, %v before", img.Digest, img.Names, img.FirstSeen, want)
		}
	}

	// (3) Every removal is in the stream exactly once, and only removals.
	types := checkContract(t, evs) // every id stored once
	t.Logf("stream: %d events %v", len(evs), types)
	deletedDigests := map[string]int{}
	for name, nDel := range imgs {
		if d, ok := junk[name]; ok {
			deletedDigests[d] += nDel
		} else if d, ok := alias[name]; !ok || !slices.Contains(slices.Collect(maps.Values(junk)), d) {
			t.Errorf("containerd deleted image %s, which no iteration made", name)
		} else if nDel != 1 {
			t.Errorf("image id name %s deleted %d times", name, nDel)
		}
	}
	for d, nDel := range deletedDigests {
		if nDel != 1 {
			t.Errorf("image %s deleted %d times by containerd's account", d, nDel)
		}
	}
	check := func(kind string, deleted map[string]int) {
		got := subjectsOf(evs, kind)
		for s := range deleted {
			if got[s] != 1 {
				t.Errorf("%s %s: %d events, want exactly 1", kind, s, got[s])
			}
		}
		for s, k := range got {
			if deleted[s] == 0 {
				t.Errorf("%s %s: %d events for an object that was not deleted", kind, s, k)
			}
		}
	}
	check("image.removed", deletedDigests)
	for id, nDel := range ctrs {
		if !slices.Contains(dead, id) {
			t.Errorf("containerd deleted container %s, which no iteration made", id)
		} else if nDel != 1 {
			t.Errorf("container %s deleted %d times by containerd's account", id, nDel)
		}
	}
	check("container.removed", ctrs)
	gonePaths := map[string]int{}
	for _, p := range logPaths {
		gonePaths[p] = 1
	}
	check("log.removed", gonePaths)
	// agent.started is in the outbox before /status answers: every agent
	// that answered (the first, the ones counted in shown, the last) has
	// one, and no agent has two.
	if n := types["agent.started"]; n < shown+2 || n > iterations+2 {
		t.Errorf("%d agent.started events: %d agents ran, %d of them answered /status", n, iterations+2, shown+2)
	}
	t.Logf("%d images, %d containers and %d log entries removed, each in the stream once", len(deletedDigests), len(ctrs), len(gonePaths))
	a.Stop()
}

// crashHits counts, in the logs of every agent that ran on stateDir, the
// kills that left a delete intent behind (resolved by the next start: the
// delete happened and its event had not been stored, or it had not
// happened yet) and the image passes that were started and never completed.
func crashHits(t *testing.T, stateDir string) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(stateDir, "agent-*.log"))
	if err != nil {
		t.Fatal(err)
	}
	hits := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		hits["intent-after-delete"] += strings.Count(text, "delete intent resolved: the object is gone")
		hits["intent-before-delete"] += strings.Count(text, "delete intent resolved: the object is still there")
		if strings.Count(text, "image gc pass started") > strings.Count(text, "image gc pass completed") {
			hits["image-pass-cut"]++
		}
		for _, line := range strings.Split(text, "\n") {
			var l struct{ Level, Message, Error string }
			if json.Unmarshal([]byte(line), &l) == nil && (l.Level == "error" || l.Level == "warn") {
				hits[l.Level+": "+l.Message+": "+l.Error]++
			}
		}
	}
	return hits
}

// imageIDs returns each image's id (its config digest, the name CRI adds)
// as written by testenv.Archive.
func imageIDs(t *testing.T, imgs ...testenv.Image) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if err := testenv.Archive(&buf, imgs...); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("archive: no manifest.json: %v", err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var manifest []struct {
			Config   string
			RepoTags []string
		}
		if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, m := range manifest {
			for _, tag := range m.RepoTags {
				out[tag] = "sha256:" + strings.TrimSuffix(m.Config, ".json")
			}
		}
		return out
	}
}
