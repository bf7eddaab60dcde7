package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
)

// TestImagePulledAgainWhileAwayIsNew: an image the agent first saw long
// ago is removed while the agent is away (the kubelet's own image GC:
// CRI's RemoveImage) and pulled again (for a pod the kubelet is about to
// start) before the agent starts again. Under disk pressure the agent
// must not take the stale first-seen time for the pulled image's: it is
// first seen now and kept for --minimum-image-ttl-duration, as a pull the
// agent watched is; an image there all along, as old, goes. Before, the
// re-pulled image kept the first-seen time of the one removed and went in
// the first pass.
func TestImagePulledAgainWhileAwayIsNew(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		app := testenv.Image{Name: "example.test/app:1", Layers: []testenv.Layer{{Seed: "again-app", Size: 2 << 20}}}
		old := testenv.Image{Name: "example.test/old:1", Layers: []testenv.Layer{{Seed: "again-old", Size: 2 << 20}}}
		c.Import(t, app, old)
		_, criImages := c.CRI(t)
		rt := node.NewRuntime(c.Client, nil, criImages)
		adopted := func() string { // CRI's id ref beside each tag, as on a node
			for _, img := range []testenv.Image{app, old} {
				rec, err := c.Client.ImageService().Get(c.Ctx(), img.Name)
				if err != nil {
					return err.Error()
				}
				names, err := rt.ImageNames(c.Ctx(), events.CRINamespace, rec.Target.Digest.String())
				if err != nil || len(names) != 2 {
					return fmt.Sprintf("%s: names %+v (%v), want its tag and CRI's id", img.Name, names, err)
				}
			}
			return ""
		}
		testenv.Eventually(t, 30*time.Second, adopted)

		// The agent sees both an hour ago (its clock an hour behind), and
		// stops.
		state := filepath.Join(t.TempDir(), "state")
		first := testenv.StartAgentEnv(t, c, state, []string{clock.TestOffsetEnv + "=-1h"}, "--image-gc-high-threshold", "100")
		waitProjected(t, first, func(rep projection.Report) bool {
			n := 0
			for _, img := range rep.Images {
				if slices.Contains(img.Names, app.Name) || slices.Contains(img.Names, old.Name) {
					n++
				}
			}
			return n == 2
		}, "the first agent has not seen both images")
		first.Stop()
		for _, f := range []string{clock.File, clock.TestOffsetFile} { // the next start reads the real time
			if err := os.Remove(filepath.Join(state, f)); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}

		// While it is away: the kubelet removes the app image and pulls it again.
		if _, err := criImages.RemoveImage(c.Ctx(), &runtime.RemoveImageRequest{Image: &runtime.ImageSpec{Image: app.Name}}); err != nil {
			t.Fatal(err)
		}
		c.Import(t, app)
		testenv.Eventually(t, 30*time.Second, adopted)

		a := testenv.StartAgent(t, c, state, "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "10m")
		testenv.Eventually(t, 60*time.Second, func() string {
			if !imageGone(t, c, old.Name) {
				return old.Name + " (first seen an hour ago) not deleted yet: " + keptBy(a, old.Name)
			}
			return ""
		})
		if imageGone(t, c, app.Name) {
			t.Fatalf("%s, pulled again while the agent was away, deleted as first seen an hour ago\n%s", app.Name, a.LogTail(20))
		}
		if got := keptBy(a, app.Name); got != "too-young " {
			t.Errorf("%s: the plan says %q, want too-young", app.Name, got)
		}
	})
}
