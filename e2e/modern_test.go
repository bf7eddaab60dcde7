package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criIDRef gives the image named name the extra name CRI gives every image
// it pulls, its image id sha256:<config digest>, labelled as CRI manages it:
// after a re-pull moves the tag, that is the only name left on the old image.
func criIDRef(t *testing.T, c *testenv.Containerd, name string) (digest, id string) {
	t.Helper()
	ctx := c.Ctx()
	img, err := c.Client.ImageService().Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.NewImage(c.Client, img).Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id = cfg.Digest.String()
	// CRI adds it itself to images it learns of in its namespace.
	if _, err := c.Client.ImageService().Create(ctx, images.Image{Name: id, Target: img.Target,
		Labels: map[string]string{projection.LabelCRIManaged: "managed"}}); err != nil && !errdefs.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return img.Target.Digest.String(), id
}

// imageExists reports whether any name points at digest.
func imageExists(t *testing.T, c *testenv.Containerd, digest string) bool {
	t.Helper()
	imgs, err := c.Client.ImageService().List(c.Ctx(), "target.digest=="+digest)
	if err != nil {
		t.Fatal(err)
	}
	return len(imgs) > 0
}

// TestModernPodsKeepTheirImages: a CRI pod runs app:1 while app:1 moves to
// another image (only CRI's image id is left on the old one), and (2.1+) a
// pod mounts an image as an OCI image volume that no container record names.
// The agent, started fresh after both, with every image over the thresholds,
// keeps both images and the sandbox image, deletes the unused ones (the
// tag's new image among them), and says why in `gcagent plan --json`; the
// same after kill -9 and a restart.
func TestModernPodsKeepTheirImages(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Pause(c.SandboxImage),
			testenv.Runnable("example.test/app:1", testenv.Layer{Seed: "app-old", Size: 64 << 10}),
			testenv.Runnable("example.test/vol:1", testenv.Layer{Seed: "vol", Size: 64 << 10}),
			testenv.Runnable("example.test/filler:1", testenv.Layer{Seed: "filler", Size: 64 << 10}))
		oldApp, oldID := criIDRef(t, c, "example.test/app:1")
		volDigest, _ := criIDRef(t, c, "example.test/vol:1")
		filler, _ := criIDRef(t, c, "example.test/filler:1")

		pod := c.RunPod(t, rt, "web", "default", "1f0c8a52-web")
		app := c.RunPodContainer(t, rt, pod, "app", "example.test/app:1", "sleep", "600")
		withVolume := v != testenv.V16 // image volumes: containerd 2.1+
		if withVolume {
			vpod := c.RunPod(t, rt, "data", "default", "2b7e41d3-data")
			c.RunPodContainerMounts(t, rt, vpod, "reader", "example.test/app:1",
				[]*runtime.Mount{{ContainerPath: "/data", Readonly: true, Image: &runtime.ImageSpec{Image: "example.test/vol:1"}}},
				"sleep", "600")
		}
		// The tag moves: a re-pull of app:1 finds a new image.
		c.Import(t, testenv.Runnable("example.test/app:1", testenv.Layer{Seed: "app-new", Size: 64 << 10}))
		newApp, _ := criIDRef(t, c, "example.test/app:1")
		if newApp == oldApp || !imageExists(t, c, oldApp) {
			t.Fatalf("tag did not move: old %s (exists %v), new %s", oldApp, imageExists(t, c, oldApp), newApp)
		}
		if withVolume {
			// Delete the volume image's tag the way a pruner would see it: only
			// its image id is left, and no container record names it.
			if err := c.Client.ImageService().Delete(c.Ctx(), "example.test/vol:1"); err != nil {
				t.Fatal(err)
			}
		}

		// The plan names why each is kept.
		plan := planJSON(t, c, "--image-gc-high-threshold=1", "--image-gc-low-threshold=0", "--minimum-image-ttl-duration=0s")
		wantReason := map[string]string{oldApp: "in-use-by-image-id"}
		if withVolume {
			wantReason[volDigest] = "image-volume"
		}
		for d, want := range wantReason {
			if got := plan[d]; got != want {
				t.Errorf("plan: %s kept as %q, want %q (plan %v)", d, got, want, plan)
			}
		}

		state := filepath.Join(t.TempDir(), "state")
		flags := []string{"--image-gc-high-threshold=1", "--image-gc-low-threshold=0", "--minimum-image-ttl-duration=0s"}
		a := testenv.StartAgent(t, c, state, flags...)
		check := func(when string) {
			testenv.Eventually(t, time.Minute, func() string {
				for _, d := range []string{newApp, filler} {
					if imageExists(t, c, d) {
						return when + ": unused image " + d + " not deleted yet\n" + a.LogTail(12)
					}
				}
				return ""
			})
			keep := map[string]string{oldApp: "the image app runs (" + oldID + ")"}
			if withVolume {
				keep[volDigest] = "the image volume"
			}
			for d, what := range keep {
				if !imageExists(t, c, d) {
					t.Errorf("%s: deleted %s %s\n%s", when, what, d, a.LogTail(30))
				}
			}
			if st, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: app}); err != nil ||
				st.Status.State != runtime.ContainerState_CONTAINER_RUNNING {
				t.Errorf("%s: app container disturbed: %v %v", when, st, err)
			}
		}
		check("fresh start")

		a.Kill()
		// Pressure again: a new unused image while the agent is down.
		c.Import(t, testenv.Runnable("example.test/filler:2", testenv.Layer{Seed: "filler2", Size: 64 << 10}))
		filler, _ = criIDRef(t, c, "example.test/filler:2")
		a = testenv.StartAgent(t, c, state, flags...)
		check("after kill -9")
	})
}

// planJSON runs `gcagent plan --json` against c and returns each image's
// reason by digest.
func planJSON(t *testing.T, c *testenv.Containerd, flags ...string) map[string]string {
	t.Helper()
	var out struct {
		Images struct {
			Delete []struct{ Digest, Reason string } `json:"delete"`
			Keep   []struct{ Digest, Reason string } `json:"keep"`
		} `json:"images"`
	}
	runPlan(t, c, &out, flags...)
	reasons := map[string]string{}
	for _, it := range append(out.Images.Delete, out.Images.Keep...) {
		reasons[it.Digest] = it.Reason
	}
	if len(reasons) == 0 {
		t.Fatalf("plan lists no image")
	}
	return reasons
}

// runPlan runs `gcagent plan --json` against c's daemon and decodes it.
func runPlan(t *testing.T, c *testenv.Containerd, v any, flags ...string) {
	t.Helper()
	args := append([]string{"plan", "--json", "--containerd-address", c.Address, "--namespace", testenv.Namespace,
		"--image-fs", c.Root, "--state-dir", t.TempDir()}, flags...)
	out, err := exec.Command(testenv.AgentBinary(t), args...).Output()
	if err != nil {
		t.Fatalf("gcagent plan: %v", err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("plan output: %v\n%s", err, out)
	}
}

// TestImageFSFollowsCRI: without --image-fs the agent measures the
// filesystem holding CRI's image filesystem (ImageFsInfo's first entry, the
// kubelet's choice), here a tmpfs root; an explicit --image-fs elsewhere is
// measured as given, and the agent says it is not CRI's.
func TestImageFSFollowsCRI(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "96m"})
		var st unix.Statfs_t
		if err := unix.Statfs(c.Root, &st); err != nil {
			t.Fatal(err)
		}
		rootCapacity := st.Blocks * uint64(st.Bsize)
		plan := func(extra ...string) (doc struct {
			ImageFS     string `json:"imageFS"`
			HistoryNote string `json:"historyNote"`
			Images      struct {
				Disk struct {
					CapacityBytes uint64 `json:"capacityBytes"`
				} `json:"disk"`
			} `json:"images"`
		}) {
			args := append([]string{"plan", "--json", "--containerd-address", c.Address, "--namespace", testenv.Namespace,
				"--state-dir", t.TempDir()}, extra...)
			out, err := exec.Command(testenv.AgentBinary(t), args...).Output()
			if err != nil {
				t.Fatalf("gcagent plan: %v", err)
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("plan output: %v\n%s", err, out)
			}
			return doc
		}
		auto := plan()
		if !strings.HasPrefix(auto.ImageFS, c.Root+"/") || auto.Images.Disk.CapacityBytes != rootCapacity {
			t.Errorf("auto: measured %s (capacity %d), want CRI's snapshotter root under %s (capacity %d)",
				auto.ImageFS, auto.Images.Disk.CapacityBytes, c.Root, rootCapacity)
		}
		other := t.TempDir()
		given := plan("--image-fs", other)
		if given.ImageFS != other || given.Images.Disk.CapacityBytes == rootCapacity ||
			!strings.Contains(given.HistoryNote, "not on CRI's image filesystem") {
			t.Errorf("explicit: measured %s (capacity %d), note %q", given.ImageFS, given.Images.Disk.CapacityBytes, given.HistoryNote)
		}
	})
}
