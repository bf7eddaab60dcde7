package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// TestContainerMadeAgainWhileAwayIsKept: a plain container "build" ran
// and exited, its client collected it (as ctr run does). While the agent
// is away, the client deletes it and creates another "build", not
// started yet (ctr c create, then ctr t start later; a script reusing its
// ids). The agent starting again must not take the new container for the
// dead one it knew: it never ran, and it stays. Before, the relist kept
// the dead one's exit on the new record and removed it a second after.
func TestContainerMadeAgainWhileAwayIsKept(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		const img = "example.test/build:1"
		c.Import(t, testenv.Runnable(img, testenv.Layer{Seed: "made-again", Size: 32 << 10}))
		state := filepath.Join(t.TempDir(), "state")
		first := testenv.StartAgent(t, c, state, "--prune-containers", "off", "--image-gc-high-threshold", "100")
		waitSynced(t, first)
		ctr := c.RunNative(t, "build", img, "true")
		c.WaitExit(t, ctr)
		if task, err := ctr.Task(c.Ctx(), nil); err == nil {
			if _, err := task.Delete(c.Ctx()); err != nil { // collected, as ctr run does
				t.Fatal(err)
			}
		}
		waitProjected(t, first, func(rep projection.Report) bool {
			return slices.ContainsFunc(rep.Containers, func(ct projection.ContainerReport) bool {
				return ct.ID == "build" && ct.State == projection.StateExited
			})
		}, "the first agent has not seen build exit")
		first.Stop()

		c.DeleteNative(t, ctr)
		c.CreateNative(t, "build", img, "true") // made again, not started

		a := testenv.StartAgent(t, c, state, "--prune-containers", "native", "--image-gc-high-threshold", "100")
		waitSynced(t, a)
		testenv.Eventually(t, 30*time.Second, func() string {
			if containerGone(t, c, "build") {
				t.Fatalf("the container made again under the dead one's id was removed\n%s", a.LogTail(20))
			}
			var p struct {
				Containers gc.ContainerPlan `json:"containers"`
			}
			if code, err := a.Get("/plan", &p); err != nil || code != 200 {
				return fmt.Sprintf("plan: %d %v", code, err)
			}
			for _, it := range slices.Concat(p.Containers.Keep, p.Containers.Remove) {
				if it.ID == "build" {
					if it.Reason != gc.ReasonNeverStarted {
						return fmt.Sprintf("build: %s %s, want kept as %s", it.State, it.Reason, gc.ReasonNeverStarted)
					}
					return ""
				}
			}
			return "build not in the plan"
		})
		if containerGone(t, c, "build") {
			t.Fatal("the container made again under the dead one's id was removed")
		}
	})
}
