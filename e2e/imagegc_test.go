package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"golang.org/x/sys/unix"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

const imgMiB = 1 << 20

// imgDisk is statfs on dir, read without any gcagent code.
func imgDisk(t testing.TB, dir string) (capacity, used uint64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	return st.Blocks * uint64(st.Bsize), (st.Blocks - st.Bavail) * uint64(st.Bsize)
}

// imgStatus is /status: the projection report plus the image GC's state.
type imgStatus struct {
	projection.Report
	ImageGC *gc.ImageGCStatus `json:"imageGC"`
}

// imgLogLine is one line of the agent's JSON log, with the fields the
// tests read.
type imgLogLine struct {
	Component string   `json:"component"`
	Message   string   `json:"message"`
	Namespace string   `json:"namespace"`
	Digest    string   `json:"digest"`
	Image     string   `json:"image"`
	Container string   `json:"container"`
	Names     []string `json:"names"`
	Reason    string   `json:"reason"`
	Freed     int64    `json:"freed"`
}

// imgAgentLog reads the agent's log lines of component.
func imgAgentLog(t testing.TB, a *testenv.Agent, component string) []imgLogLine {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []imgLogLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l imgLogLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Component == component {
			out = append(out, l)
		}
	}
	return out
}

// imgRemoved are the digests the agent logged as removed, in order.
func imgRemoved(t testing.TB, a *testenv.Agent) []string {
	var out []string
	for _, l := range imgAgentLog(t, a, "imagegc") {
		if l.Message == "image removed" {
			out = append(out, l.Digest)
		}
	}
	return out
}

// TestImageGC fills a small containerd root above the high threshold and
// checks that the agent deletes exactly the least recently used eligible
// images, in that order, until statfs shows the low threshold, and never an
// image in use (running or exited container), pinned, the sandbox image, or
// kept by a pattern.
func TestImageGC(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testImageGC(t, v) })
	}
}

func testImageGC(t *testing.T, v testenv.Version) {
	// The root starts larger than the disk the thresholds are planned for;
	// shrinking it to that size is the crossing (see below).
	const rootMiB, extraMiB = 320, 200
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: fmt.Sprintf("%dm", rootMiB+extraMiB)})
	ctx := c.Ctx()
	const data = 12 * imgMiB
	base := testenv.Layer{Seed: "shared-base", Size: 8 * imgMiB}
	layer := func(seed string, size int64) testenv.Layer { return testenv.Layer{Seed: seed, Size: size} }
	recs := c.Import(t,
		testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/v0:1", layer("v0", data)), // never used
		testenv.Runnable("example.test/v1:1", base, layer("v1", data)),
		testenv.Runnable("example.test/v2:1", base, layer("v2", data)),
		testenv.Runnable("example.test/v3:1", layer("v3", data)),
		testenv.Runnable("example.test/v4:1", layer("v4", data)),
		testenv.Runnable("example.test/run:1", layer("run", 8*imgMiB)),
		testenv.Runnable("example.test/exited:1", layer("exited", 8*imgMiB)),
		testenv.Runnable("example.test/pinned:1", layer("pinned", 8*imgMiB)),
		testenv.Runnable("keep.test/tools:1", layer("keep", 8*imgMiB)),
	)
	digest := map[string]string{} // name -> target digest
	for _, r := range recs {
		digest[r.Name] = r.Target.Digest.String()
	}
	// Pinned through a second name only, as CRI pins one ref of an image.
	pinned, err := c.Client.ImageService().Get(ctx, "example.test/pinned:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.ImageService().Create(ctx, images.Image{Name: "example.test/pinned:alias", Target: pinned.Target,
		Labels: map[string]string{projection.LabelPinned: projection.LabelPinnedValue}}); err != nil {
		t.Fatal(err)
	}
	c.RunNative(t, "c-running", "example.test/run:1", "sleep", "600")
	exited := c.RunNative(t, "c-exited", "example.test/exited:1", "true")
	c.WaitExit(t, exited)

	// The fill (2x fill bytes, what an image of that size takes: blob and
	// snapshot) is allocated now, while the disk is large enough for it to
	// cross nothing.
	const fill = 24 * imgMiB
	fillFile, err := os.Create(filepath.Join(c.Root, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(fillFile.Fd()), 0, 0, int64(2*fill)); err != nil {
		t.Fatalf("fallocate the fill: %v", err)
	}
	fillFile.Close()

	// Thresholds from the measured disk, as it will be once shrunk: the
	// fill crosses high; low falls halfway through the third image to
	// delete, so exactly three go: v0 (never used), v3, v1.
	capacity := uint64(rootMiB * imgMiB)
	_, post := imgDisk(t, c.Root)
	pre := post - 2*fill
	lru := []string{"example.test/v0:1", "example.test/v3:1", "example.test/v1:1", "example.test/v4:1", "example.test/v2:1"}
	freed := []uint64{2 * data, 2 * data, 2 * data, 2 * data, 2*data + 2*uint64(base.Size)} // v2 frees the base v1 shared
	const k = 3
	after := func(n int) uint64 { // usage after the first n deletions
		u := post
		for _, f := range freed[:n] {
			u -= f
		}
		return u
	}
	low := int(math.Round(float64(after(k-1)+after(k)) / 2 * 100 / float64(capacity)))
	high := int(math.Ceil(float64(pre)*100/float64(capacity))) + 4
	lowBytes := capacity * uint64(low) / 100
	if after(k)+6*imgMiB > lowBytes || after(k-1) < lowBytes+6*imgMiB || float64(post)*100/float64(capacity) < float64(high)+3 || low >= high {
		t.Fatalf("test setup: thresholds %d/%d on %d MiB (pre %d MiB, post %d MiB) leave no margin", high, low,
			capacity/imgMiB, pre/imgMiB, post/imgMiB)
	}
	if before := float64(post) * 100 / float64((rootMiB+extraMiB)*imgMiB); before+3 > float64(high) {
		t.Fatalf("test setup: %.1f%% used before the shrink, too close to the high threshold %d%%", before, high)
	}
	t.Logf("disk %d MiB, used %d MiB (%.1f%%), after fill ~%d MiB; high %d%% low %d%%", capacity/imgMiB, pre/imgMiB,
		float64(pre)*100/float64(capacity), post/imgMiB, high, low)

	a := testenv.StartAgent(t, c, t.TempDir(),
		fmt.Sprintf("--image-gc-high-threshold=%d", high), fmt.Sprintf("--image-gc-low-threshold=%d", low),
		"--minimum-image-ttl-duration=1s", "--keep-image=keep.test/*", "--prune-containers=off")
	get := func() (imgStatus, string) {
		var st imgStatus
		if code, err := a.Get("/status", &st); err != nil || code != 200 {
			return st, fmt.Sprintf("status: %d %v", code, err)
		}
		return st, ""
	}
	status := func() imgStatus {
		st, why := get()
		if why != "" {
			t.Fatal(why)
		}
		return st
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		st, why := get()
		if why == "" && (!st.Synced || st.ImageGC == nil) {
			why = "not synced"
		}
		return why
	})

	// Last use, oldest first: v3, v1, v4, v2 (v0 is never used).
	for _, name := range lru[1:] {
		id := "lru-" + strings.TrimSuffix(strings.TrimPrefix(name, "example.test/"), ":1")
		ctr := c.RunNative(t, id, name, "true")
		c.WaitExit(t, ctr)
		c.DeleteNative(t, ctr)
		testenv.Eventually(t, 30*time.Second, func() string {
			for _, img := range status().Images {
				if img.Digest == digest[name] && !img.LastUsed.IsZero() && len(img.Users) == 0 {
					return ""
				}
			}
			return name + ": last use not seen yet"
		})
	}
	if got := imgRemoved(t, a); len(got) > 0 {
		t.Fatalf("removed %v below the high threshold", got)
	}

	// Push usage over the high threshold in one step: shrink the tmpfs to
	// the planned capacity. statfs sees the new size at once and the used
	// bytes do not move, so whichever sample sees the crossing (the 1 s
	// statfs, or a projection change) plans from the whole fill. The fill
	// used to be an image import, which takes seconds to land (blob, then
	// unpack, and containerd 1.6 sends no event during the unpack): on a
	// loaded machine the statfs caught it halfway, the pass freed down to
	// the low threshold of a disk still growing, and the rest of the unpack
	// left usage between low and high, so two images went instead of
	// three. The agent was right; the test assumed the crossing was
	// instant (fallocate is not either: tmpfs allocates page by page).
	if _, used := imgDisk(t, c.Root); used+imgMiB < post || used > post+imgMiB {
		t.Fatalf("test setup: %d MiB used before the crossing, thresholds planned for %d MiB", used/imgMiB, post/imgMiB)
	}
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_REMOUNT, fmt.Sprintf("size=%dm", rootMiB)); err != nil {
		t.Fatalf("shrink the image filesystem: %v", err)
	}
	if got, _ := imgDisk(t, c.Root); got != capacity {
		t.Fatalf("test setup: capacity %d MiB after the shrink, want %d MiB", got/imgMiB, capacity/imgMiB)
	}
	crossed := time.Now()
	var st imgStatus
	testenv.Eventually(t, 30*time.Second, func() string {
		st = status()
		if p := st.ImageGC.LastPass; p == nil || !p.Triggered || !p.LowReached {
			return fmt.Sprintf("no pass down to the low threshold yet: %+v", p)
		}
		return ""
	})
	t.Logf("low threshold reached %s after the fill", time.Since(crossed).Round(time.Millisecond))
	// The pass planned from the whole crossing.
	if d := st.ImageGC.LastPass.Disk; d.CapacityBytes != capacity || d.CapacityBytes-d.AvailableBytes+imgMiB < post || d.CapacityBytes-d.AvailableBytes > post+imgMiB {
		t.Fatalf("the pass planned from %d of %d MiB used, want %d of %d MiB", (d.CapacityBytes-d.AvailableBytes)/imgMiB,
			d.CapacityBytes/imgMiB, post/imgMiB, capacity/imgMiB)
	}

	var want []string
	for _, name := range lru[:k] {
		want = append(want, digest[name])
	}
	if got := imgRemoved(t, a); !slices.Equal(got, want) {
		t.Fatalf("removed (in order) %v, want %v (%v)", got, want, lru[:k])
	}
	if _, used := imgDisk(t, c.Root); used > lowBytes {
		t.Errorf("statfs: %d MiB used, above the low threshold (%d%% = %d MiB)", used/imgMiB, low, lowBytes/imgMiB)
	} else if used+freed[k-1] <= lowBytes {
		t.Errorf("statfs: %d MiB used: one deletion fewer would have reached the low threshold %d MiB", used/imgMiB, lowBytes/imgMiB)
	}
	truth := c.Truth(t)
	for _, name := range []string{c.SandboxImage, "example.test/run:1", "example.test/exited:1", "example.test/pinned:1",
		"example.test/pinned:alias", "keep.test/tools:1", "example.test/v4:1", "example.test/v2:1"} {
		d := digest[name]
		if name == "example.test/pinned:alias" {
			d = digest["example.test/pinned:1"]
		}
		if !slices.Contains(truth.Images[d], name) {
			t.Errorf("%s was deleted", name)
		}
	}
	for _, name := range lru[:k] {
		if names, ok := truth.Images[digest[name]]; ok {
			t.Errorf("%s still has names %v", name, names)
		}
	}
	if v == testenv.V16 && !slices.Contains(st.ImageGC.SandboxImages, c.SandboxImage) {
		t.Errorf("sandbox image not learned from CRI on %s: %v", v, st.ImageGC.SandboxImages)
	}
	skips := map[string]string{}
	for _, o := range st.ImageGC.LastPass.Skipped {
		skips[o.Digest] = string(o.Reason)
	}
	t.Logf("last pass: removed %d, estimated %d MiB, freed (statfs) %d MiB, usage %d%%, skipped %v",
		len(st.ImageGC.LastPass.Removed), st.ImageGC.LastPass.EstimatedBytes/imgMiB, st.ImageGC.LastPass.FreedBytes/imgMiB,
		st.ImageGC.LastPass.UsageAfter, skips)

	// `gcagent plan` against the same daemon: a one-shot dry run that keeps
	// the protected images, each with its reason.
	out, err := exec.Command(testenv.AgentBinary(t), "plan", "--json", "--containerd-address", c.Address,
		"--namespace", testenv.Namespace, "--image-fs", c.Root, "--state-dir", t.TempDir(),
		fmt.Sprintf("--image-gc-high-threshold=%d", high), fmt.Sprintf("--image-gc-low-threshold=%d", low),
		"--minimum-image-ttl-duration=1s", "--keep-image=keep.test/*").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("gcagent plan: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("gcagent plan: %v", err)
	}
	var doc struct {
		History string       `json:"history"`
		Images  gc.ImagePlan `json:"images"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("plan output: %v\n%s", err, out)
	}
	reason := map[string]gc.Reason{}
	for _, it := range append(doc.Images.Delete, doc.Images.Keep...) {
		reason[it.Digest] = it.Reason
	}
	for name, want := range map[string]gc.Reason{
		"example.test/run:1": gc.ReasonInUseBySnap, "example.test/exited:1": gc.ReasonInUseBySnap,
		"example.test/pinned:1": gc.ReasonPinned, "keep.test/tools:1": gc.ReasonKeepPattern,
	} {
		if got := reason[digest[name]]; got != want {
			t.Errorf("plan: %s %q, want %q", name, got, want)
		}
	}
	if got := reason[digest[c.SandboxImage]]; got != gc.ReasonSandboxImage && got != gc.ReasonPinned {
		t.Errorf("plan: sandbox image %q", got)
	}
	if doc.History != "none" || doc.Images.Disk.CapacityBytes != capacity {
		t.Errorf("plan: history %q, capacity %d", doc.History, doc.Images.Disk.CapacityBytes)
	}
}

// TestImageGCInFlightPull holds an otherwise eligible image's target in a
// lease, as a pull of one of its names would, and checks that the agent
// skips it (in-flight-pull) while deleting the other candidate, then deletes
// it on a pass after the lease is gone.
func TestImageGCInFlightPull(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testImageGCInFlightPull(t, v) })
	}
}

func testImageGCInFlightPull(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "160m"})
	ctx := c.Ctx()
	layer := func(seed string, size int64) testenv.Layer { return testenv.Layer{Seed: seed, Size: size} }
	recs := c.Import(t,
		testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/leased:1", layer("leased", 8*imgMiB)),
		testenv.Runnable("example.test/free:1", layer("free", 8*imgMiB)),
	)
	digest := map[string]string{}
	for _, r := range recs {
		digest[r.Name] = r.Target.Digest.String()
	}
	leased, free := digest["example.test/leased:1"], digest["example.test/free:1"]

	ls := c.Client.LeasesService()
	lease, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.AddResource(ctx, lease, leases.Resource{ID: leased, Type: "content"}); err != nil {
		t.Fatal(err)
	}

	// High just above the usage now; low out of reach, so that every
	// eligible image is a candidate.
	const fill = 16 * imgMiB
	capacity, pre := imgDisk(t, c.Root)
	high := int(math.Ceil(float64(pre)*100/float64(capacity))) + 4
	if post := float64(pre+2*fill) * 100 / float64(capacity); post < float64(high)+3 {
		t.Fatalf("test setup: the fill brings usage to %.1f%%, not clearly above the high threshold %d%%", post, high)
	}
	a := testenv.StartAgent(t, c, t.TempDir(),
		fmt.Sprintf("--image-gc-high-threshold=%d", high), "--image-gc-low-threshold=1",
		"--minimum-image-ttl-duration=1s", "--keep-image=keep.test/*", "--prune-containers=off")
	testenv.Eventually(t, 30*time.Second, func() string {
		var st imgStatus
		if code, err := a.Get("/status", &st); err != nil || code != 200 {
			return fmt.Sprintf("status: %d %v", code, err)
		}
		if !st.Synced {
			return "not synced"
		}
		return ""
	})
	skippedInFlight := func() bool {
		for _, l := range imgAgentLog(t, a, "imagegc") {
			if l.Message == "image skipped" && l.Digest == leased && l.Reason == string(gc.ReasonInFlightPull) {
				return true
			}
		}
		return false
	}

	c.Import(t, testenv.Runnable("keep.test/fill:1", layer("fill", fill)))
	testenv.Eventually(t, 30*time.Second, func() string {
		if !slices.Contains(imgRemoved(t, a), free) {
			return "the free image is not removed yet"
		}
		if !skippedInFlight() {
			return "no in-flight-pull skip of the leased image logged yet"
		}
		return ""
	})
	if slices.Contains(imgRemoved(t, a), leased) {
		t.Fatalf("removed the image a lease holds")
	}
	if names := c.Truth(t).Images[leased]; !slices.Contains(names, "example.test/leased:1") {
		t.Fatalf("leased image lost its name: %v", names)
	}

	// The pull ends; the next pass (on the next change) deletes it.
	if err := ls.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	c.Import(t, testenv.Runnable("keep.test/poke:1", layer("poke", imgMiB)))
	testenv.Eventually(t, 30*time.Second, func() string {
		if !slices.Contains(imgRemoved(t, a), leased) {
			return "the formerly leased image is not removed yet"
		}
		return ""
	})
	if _, ok := c.Truth(t).Images[leased]; ok {
		t.Errorf("the formerly leased image still has names")
	}
}
