package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nativeImageRef reads what the re-check is asked about an image: its
// target digest, its names, its config digest and its top chain id.
func nativeImageRef(t *testing.T, c *testenv.Containerd, name string) gc.ImageRef {
	t.Helper()
	ctx := c.Ctx()
	img, err := c.Client.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return gc.ImageRef{Digest: img.Target().Digest.String(), Names: []string{name}, Config: cfg.Digest.String(),
		Chain: identity.ChainID(diffIDs).String()}
}

// startNativeDaemon starts a private daemon whose default snapshotter is
// native (CRI's, and the client's through the namespace label) and checks
// that an imported image is unpacked there and not on overlayfs.
func startNativeDaemon(t *testing.T, v testenv.Version, imgs ...testenv.Image) *testenv.Containerd {
	t.Helper()
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.SetDefaultSnapshotter(t, "native")
	c.Import(t, imgs...)
	ctx := c.Ctx()
	ref := nativeImageRef(t, c, imgs[0].Name)
	if _, err := c.Client.SnapshotService("native").Stat(ctx, ref.Chain); err != nil {
		t.Fatalf("test setup: %s not unpacked on native: %v", imgs[0].Name, err)
	}
	if _, err := c.Client.SnapshotService("overlayfs").Stat(ctx, ref.Chain); err == nil {
		t.Fatalf("test setup: %s unpacked on overlayfs too", imgs[0].Name)
	}
	// CRI's image filesystem is its snapshotter's root.
	_, criImages := c.CRI(t)
	fs, err := criImages.ImageFsInfo(ctx, &runtime.ImageFsInfoRequest{})
	if err != nil {
		t.Fatalf("cri image fs info: %v", err)
	}
	var mounts []string
	for _, f := range fs.GetImageFilesystems() {
		mounts = append(mounts, f.GetFsId().GetMountpoint())
	}
	if len(mounts) == 0 || !strings.HasSuffix(mounts[0], "io.containerd.snapshotter.v1.native") {
		t.Fatalf("test setup: CRI's image filesystems are %v, not native's", mounts)
	}
	return c
}

// overlayfsOnlyHolders is what the re-check of dcc6c9f asked containerd
// about a snapshot-backed image (gc.Runtime.ImageUsers with the wiring's
// Snapshotters unset): the active and view children of its chain on
// overlayfs alone.
func overlayfsOnlyHolders(t *testing.T, c *testenv.Containerd, chain string) []string {
	t.Helper()
	var out []string
	err := c.Client.SnapshotService("overlayfs").Walk(c.Ctx(), func(_ context.Context, info snapshots.Info) error {
		if info.Parent == chain && info.Kind != snapshots.KindCommitted {
			out = append(out, info.Name)
		}
		return nil
	}, fmt.Sprintf("parent==%q", chain))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNativeSnapshotterRecheck (issue 25, finding 2): on a daemon whose
// default snapshotter is native, the re-check right before a delete
// (node.Runtime.ImageHolders, asked of the real daemon) reports a
// container's rootfs on native, a plain one and one remapped as
// `ctr run --uidmap/--gidmap` makes it, and nothing for an unused image.
//
// On dcc6c9f the re-check was gc.Runtime{Client, CRI, CRIImages}.ImageUsers
// with Snapshotters unset (cmd/gcagent/run.go never set it), which walks
// overlayfs alone: the same test run there (a scratch worktree, the
// container made the same way) got ImageUsers = [] on 1.6 and on 2.3 for
// the image of a running native container, so the executor deleted it.
// overlayfsOnlyHolders repeats that walk here: it finds nothing either.
func TestNativeSnapshotterRecheck(t *testing.T) {
	t.Parallel()
	forEachVersion(t, testNativeSnapshotterRecheck)
}

func testNativeSnapshotterRecheck(t *testing.T, v testenv.Version) {
	const used, unused = "example.test/native-used:1", "example.test/native-unused:1"
	c := startNativeDaemon(t, v,
		testenv.Runnable(used, testenv.Layer{Seed: "native-used-" + string(v), Size: 64 << 10}),
		testenv.Runnable(unused, testenv.Layer{Seed: "native-unused-" + string(v), Size: 64 << 10}))
	ctx := c.Ctx()
	ref, free := nativeImageRef(t, c, used), nativeImageRef(t, c, unused)

	id := fmt.Sprintf("native-%d", time.Now().UnixNano())
	c.RunNative(t, id, used, "sleep", "600")
	rec, err := c.Client.ContainerService().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Snapshotter != "native" {
		t.Fatalf("test setup: container %s is on %q, want native", id, rec.Snapshotter)
	}
	// The same through ctr, remapped: rootfs -> chowned copy -> chain.
	remapped := id + "-remap"
	remapRun(t, c, v, used, remapped)
	rrec, err := c.Client.ContainerService().Get(ctx, remapped)
	if err != nil {
		t.Fatal(err)
	}
	if rrec.Snapshotter != "native" {
		t.Fatalf("test setup: ctr run --uidmap made %s on %q, want native", remapped, rrec.Snapshotter)
	}

	cri, criImages := c.CRI(t)
	rt := node.NewRuntime(c.Client, cri, criImages)
	holders, err := rt.ImageHolders(ctx, testenv.Namespace, ref)
	if err != nil {
		t.Fatalf("ImageHolders: %v", err)
	}
	want := []gc.Holder{{Kind: gc.HolderSnapshot, ID: "native/" + rec.SnapshotKey}, {Kind: gc.HolderSnapshot, ID: "native/" + rrec.SnapshotKey}}
	for _, h := range want {
		if !slices.Contains(holders, h) {
			t.Errorf("ImageHolders(%s) = %v, missing %v", used, holders, h)
		}
	}
	t.Logf("containerd %s: ImageHolders(%s) = %v; the overlayfs-only walk of dcc6c9f finds %v", v, used, holders,
		overlayfsOnlyHolders(t, c, ref.Chain))
	if got := overlayfsOnlyHolders(t, c, ref.Chain); len(got) != 0 {
		t.Errorf("test setup: overlayfs holds %v", got)
	}
	if holders, err := rt.ImageHolders(ctx, testenv.Namespace, free); err != nil || len(holders) != 0 {
		t.Errorf("ImageHolders(%s) = %v, %v; want none", unused, holders, err)
	}
}

// TestNativeSnapshotterKeepsImage (issue 25, finding 2) runs the agent
// with --image-maximum-gc-age on a daemon whose default snapshotter is
// native. It keeps the image of a native container made before it started
// (the projection's answer), deletes an unused image (passes ran), and
// keeps an image whose container is being created while a pass runs: the
// rootfs is prepared on native from the image, as client.WithNewSnapshot
// does before the container record exists, so the projection, which knows
// containers, cannot see it and only the re-check right before the delete
// can. The container is then created on that rootfs and the image stays.
//
// On dcc6c9f the same test (run in a scratch worktree) deleted the image
// of the container being created on both daemons: its re-check looked at
// overlayfs only.
func TestNativeSnapshotterKeepsImage(t *testing.T) {
	t.Parallel()
	forEachVersion(t, testNativeSnapshotterKeepsImage)
}

func testNativeSnapshotterKeepsImage(t *testing.T, v testenv.Version) {
	const used, creating, unused = "example.test/native-used:1", "example.test/native-creating:1", "example.test/native-unused:1"
	c := startNativeDaemon(t, v,
		testenv.Runnable(used, testenv.Layer{Seed: "nk-used-" + string(v), Size: 64 << 10}),
		testenv.Runnable(creating, testenv.Layer{Seed: "nk-creating-" + string(v), Size: 64 << 10}),
		testenv.Runnable(unused, testenv.Layer{Seed: "nk-unused-" + string(v), Size: 64 << 10}))
	ctx := c.Ctx()
	digest := map[string]string{}
	for _, n := range []string{used, creating, unused} {
		digest[n] = nativeImageRef(t, c, n).Digest
	}

	id := fmt.Sprintf("native-%d", time.Now().UnixNano())
	c.RunNative(t, id, used, "sleep", "600")

	// The first half of creating a container on native: its rootfs.
	img, err := c.Client.GetImage(ctx, creating)
	if err != nil {
		t.Fatal(err)
	}
	// Under a lease, as client.NewContainer prepares it: containerd's
	// garbage collector removes an active snapshot that nothing holds.
	lctx, done, err := c.Client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = done(ctx) }()
	cid := id + "-creating"
	chain := nativeImageRef(t, c, creating).Chain
	if _, err := c.Client.SnapshotService("native").Prepare(lctx, cid, chain); err != nil {
		t.Fatalf("prepare %s on native: %v", cid, err)
	}

	a := testenv.StartAgent(t, c, t.TempDir(), "--image-gc-high-threshold=100",
		"--minimum-image-ttl-duration=0s", "--image-maximum-gc-age=1s", "--prune-containers=off")
	// The pass that removed the unused image logs its skips when it ends.
	testenv.Eventually(t, 60*time.Second, func() string {
		removedAt := -1
		for i, l := range agentLog(t, a) {
			switch {
			case l.Component != "imagegc":
			case l.Message == "image removed" && l.Digest == digest[unused]:
				removedAt = i
			case removedAt >= 0 && strings.HasPrefix(l.Message, "image gc pass "):
				return ""
			}
		}
		return "no pass has removed the unused image yet"
	})
	var kept []agentLine
	for _, l := range agentLog(t, a) {
		if l.Component == "imagegc" && l.Message == "image skipped" && l.Digest == digest[creating] {
			kept = append(kept, l)
		}
	}
	removed := imgRemoved(t, a)
	for _, n := range []string{used, creating} {
		if slices.Contains(removed, digest[n]) || imageGone(t, c, n) {
			t.Errorf("%s was deleted (removed %v)", n, removed)
		}
	}
	if len(kept) == 0 || kept[0].Reason != string(gc.ReasonInUse) {
		t.Errorf("no in-use skip of %s by the re-check: %+v", creating, kept)
	} else {
		t.Logf("containerd %s: %s skipped %d times: %s (%s)", v, creating, len(kept), kept[0].Reason, kept[0].Detail)
		if !strings.Contains(kept[0].Detail, "snapshot:native/"+cid) {
			t.Errorf("the skip of %s does not name the rootfs native/%s: %s", creating, cid, kept[0].Detail)
		}
	}

	// The container record follows; its image stays.
	ctr, err := c.Client.NewContainer(lctx, cid, client.WithImage(img), client.WithSnapshotter("native"), client.WithSnapshot(cid),
		client.WithRuntime("io.containerd.runc.v2", nil), client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("true")))
	if err != nil {
		t.Fatalf("container %s: %v", cid, err)
	}
	defer func() { _ = ctr.Delete(ctx, client.WithSnapshotCleanup) }()
	if err := done(ctx); err != nil {
		t.Fatalf("end the lease: %v", err)
	}
	waitProjected(t, a, func(rep projection.Report) bool {
		for _, im := range rep.Images {
			if im.Digest == digest[creating] {
				return slices.Contains(im.Users, cid)
			}
		}
		return false
	}, fmt.Sprintf("container %s is not a user of %s", cid, creating))
	if imageGone(t, c, creating) || imageGone(t, c, used) {
		t.Errorf("an image in use was deleted (removed %v)", imgRemoved(t, a))
	}
}

// agentLine is one line of the agent's JSON log, with the fields the
// delete path logs.
type agentLine struct {
	Level     string    `json:"level"`
	Time      time.Time `json:"time"`
	Component string    `json:"component"`
	Message   string    `json:"message"`
	Digest    string    `json:"digest"`
	Kind      string    `json:"kind"`
	Subject   string    `json:"subject"`
	Reason    string    `json:"reason"`
	Detail    string    `json:"detail"`
	Freed     int64     `json:"freed"`
	Error     string    `json:"error"`
	Usage     *int      `json:"usage"`
	Trigger   string    `json:"trigger"`
	Pass      string    `json:"pass"`
}

// agentLog reads every line of the agent's JSON log, in order.
func agentLog(t testing.TB, a *testenv.Agent) []agentLine {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []agentLine
	for _, raw := range strings.Split(string(b), "\n") {
		var l agentLine
		if json.Unmarshal([]byte(raw), &l) == nil && l.Message != "" {
			out = append(out, l)
		}
	}
	return out
}
