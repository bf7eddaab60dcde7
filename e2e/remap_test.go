package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/image-spec/identity"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// TestRemapKeepsImage (issue 25, finding 1): `ctr run --uidmap/--gidmap`
// (the client's WithRemappedSnapshot) prepares the container's rootfs from
// a remapped copy of the image, a committed snapshot whose parent is the
// image's top chain id. Under --image-maximum-gc-age the image of such a
// container must be kept (a pass that deletes an unused image shows that
// passes ran), and the projection must list the container as its user,
// whether it found the container in a listing or in a create event.
func TestRemapKeepsImage(t *testing.T) {
	t.Parallel()
	forEachVersion(t, testRemapKeepsImage)
}

func testRemapKeepsImage(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	ctx := c.Ctx()
	const used, unused = "example.test/remap:1", "example.test/unused:1"
	recs := c.Import(t,
		testenv.Runnable(used, testenv.Layer{Seed: "remap-" + string(v), Size: 64 << 10}),
		testenv.Runnable(unused, testenv.Layer{Seed: "unused-" + string(v), Size: 64 << 10}),
	)
	digest := map[string]string{}
	for _, r := range recs {
		digest[r.Name] = r.Target.Digest.String()
	}

	id := fmt.Sprintf("remap-%d", time.Now().UnixNano())
	remapRun(t, c, v, used, id)

	// The shape this test is about: rootfs -> remapped copy -> image top.
	rec, err := c.Client.ContainerService().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	img, err := c.Client.GetImage(ctx, used)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain := identity.ChainID(diffIDs).String()
	sn := c.Client.SnapshotService(rec.Snapshotter)
	root, err := sn.Stat(ctx, rec.SnapshotKey)
	if err != nil {
		t.Fatal(err)
	}
	remapped, err := sn.Stat(ctx, root.Parent)
	if err != nil {
		t.Fatal(err)
	}
	if root.Parent == chain || remapped.Parent != chain {
		t.Fatalf("test setup: rootfs %s -> %s -> %s, want a remapped snapshot between it and the image's chain %s",
			rec.SnapshotKey, root.Parent, remapped.Parent, chain)
	}
	t.Logf("containerd %s: rootfs %s -> remapped %s -> chain %s", v, rec.SnapshotKey, root.Parent, chain)

	a := testenv.StartAgent(t, c, t.TempDir(), "--image-gc-high-threshold=100",
		"--minimum-image-ttl-duration=0s", "--image-maximum-gc-age=1s", "--prune-containers=off")
	// A pass deleted the unused image: the used one was planned with it.
	var st imgStatus
	testenv.Eventually(t, 30*time.Second, func() string {
		st = imgStatus{}
		if code, err := a.Get("/status", &st); err != nil || code != 200 {
			return fmt.Sprintf("status: %d %v", code, err)
		}
		if st.ImageGC == nil || st.ImageGC.LastPass == nil {
			return "no pass yet"
		}
		for _, o := range st.ImageGC.LastPass.Removed {
			if o.Digest == digest[unused] {
				return ""
			}
		}
		return fmt.Sprintf("the unused image %s not removed by the last pass (%d passes)", digest[unused], st.ImageGC.Passes)
	})
	if removed := imgRemoved(t, a); slices.Contains(removed, digest[used]) || imageGone(t, c, used) {
		t.Fatalf("the image of remapped container %s was deleted (removed: %v)", id, removed)
	}
	var users []string
	for _, im := range st.Images {
		if im.Digest == digest[used] {
			users = im.Users
		}
	}
	if !slices.Contains(users, id) {
		t.Errorf("the projection does not list remapped container %s as a user of %s (users %v)", id, used, users)
	}

	// A second one while the agent follows: its create event's lookup
	// walks the same ancestry through containerd (a Stat per snapshot, a
	// content walk per chain), with no listing to mend a failed lookup.
	id2 := id + "-2"
	remapRun(t, c, v, used, id2)
	waitProjected(t, a, func(rep projection.Report) bool {
		for _, im := range rep.Images {
			if im.Digest == digest[used] {
				return slices.Contains(im.Users, id2)
			}
		}
		return false
	}, fmt.Sprintf("remapped container %s, created while the agent runs, is not a user of %s", id2, used))
	m := mustMetrics(t, a)
	if n := metricSum(m, "gcagent_events_lookup_errors_total"); n != 0 {
		t.Errorf("%v event lookups failed", n)
	}
	if n := metricSum(m, `gcagent_events_listings_total{reason="repair"}`); n != 0 {
		t.Errorf("%v repair listings: the lookup did not find the user alone", n)
	}
	if imageGone(t, c, used) {
		t.Errorf("the image of remapped containers %s and %s was deleted", id, id2)
	}
}

// remapRun runs `ctr run --uidmap --gidmap` with the daemon's own ctr, as an
// operator does: the client's WithRemappedSnapshot. runc's root and the
// cgroup are under the test's dir, as CreateNative does; the remapped root
// (uid 100000) must be able to reach its bundle below that dir.
func remapRun(t *testing.T, c *testenv.Containerd, v testenv.Version, image, id string) {
	t.Helper()
	if err := os.Chmod(c.Dir, 0o711); err != nil {
		t.Fatal(err)
	}
	ctr := filepath.Join(testenv.BinDir(v), "ctr")
	out, err := exec.Command(ctr, "-a", c.Address, "-n", testenv.Namespace, "run", "-d", "--null-io",
		"--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536",
		"--runc-root", filepath.Join(c.Dir, "runc"), "--cgroup", "/"+filepath.Base(c.Dir)+"/"+id,
		image, id, "sleep", "600").CombinedOutput()
	if err != nil {
		t.Fatalf("%s run --uidmap: %v\n%s", ctr, err, out)
	}
}
