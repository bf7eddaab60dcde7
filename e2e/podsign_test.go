package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerGCPass is what the tests read of the container GC's last pass
// in /status.
type containerGCPass struct {
	ContainerGC *struct {
		Passes uint64 `json:"passes"`
		Plan   struct {
			Now       time.Time `json:"now"`
			PodLogDir *struct {
				State string `json:"state"`
			} `json:"podLogDir"`
		} `json:"plan"`
	} `json:"containerGC"`
}

// waitPassAfter waits until the agent's container GC has made a pass
// planned after t, with the pod log dir in the state want ("" : any);
// fatal, while it waits, as soon as removed (nil: never) says so.
func waitPassAfter(t *testing.T, a *testenv.Agent, after time.Time, want string, removed func() string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() string {
		if removed != nil {
			if why := removed(); why != "" {
				t.Fatal(why)
			}
		}
		var st containerGCPass
		if code, err := a.Get("/status", &st); err != nil || code != 200 || st.ContainerGC == nil {
			return fmt.Sprintf("status %d %v", code, err)
		}
		p := st.ContainerGC.Plan
		if !p.Now.After(after) {
			return fmt.Sprintf("last pass planned at %s, want after %s", p.Now.Format(time.StampMilli), after.Format(time.StampMilli))
		}
		if want != "" && (p.PodLogDir == nil || p.PodLogDir.State != want) {
			b, _ := json.Marshal(p.PodLogDir)
			return fmt.Sprintf("pod log dir %s, want %s", b, want)
		}
		return ""
	})
}

// TestDeletedPodSignNeedsASeenDir (issue 34, item 2): a pod counts as
// deleted only after the agent saw its log dir and then saw it go.
//
//   - A --pod-log-dir that exists but is not the kubelet's (empty), with no
//     pod running: the stopped pod keeps its newest sandbox and its last
//     dead container past --pod-log-grace (7485972 removed both).
//   - The right dir, the pod's dir seen, the agent stopped, the dir removed
//     meanwhile: after the restart the pod is deleted, its container and
//     sandbox go (the evidence is kept in the state dir), not before the
//     grace from the restart.
//   - The same with the agent's state lost (a fresh state dir): nothing
//     says the dir was ever there, so the pod keeps both.
func TestDeletedPodSignNeedsASeenDir(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		l := recordLifecycle(t, c)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		l.waitActive(t)
		const grace = 2 * time.Second
		flags := []string{"--prune-containers=all", "--maximum-dead-containers-per-container=1", "--pod-log-grace=" + grace.String()}
		ctx := c.Ctx()
		stopped := func(name, uid string) (*testenv.Pod, string) {
			p := c.RunPod(t, rt, name, "default", uid)
			id := c.RunPodContainerAttempt(t, rt, p, "app", 0, gcImage, "sh", "-c", "exit 2")
			waitCRIExited(t, c, rt, id)
			if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.SandboxID}); err != nil {
				t.Fatal(err)
			}
			return p, id
		}
		// removed says which of ids CRI no longer lists.
		removed := func(what string, ids ...string) func() string {
			return func() string {
				view := listCRIView(t, c, rt)
				for _, id := range ids {
					_, ctr := view.criContainers[id]
					_, sb := view.criSandboxes[id]
					if !ctr && !sb {
						return fmt.Sprintf("%s: %s removed", what, id)
					}
				}
				return ""
			}
		}
		kept := func(what string, ids ...string) {
			t.Helper()
			if why := removed(what, ids...)(); why != "" {
				t.Error(why)
			}
		}

		// 1. Not the kubelet's dir, no pod running.
		elsewhere := filepath.Join(t.TempDir(), "pods")
		if err := os.MkdirAll(elsewhere, 0o755); err != nil {
			t.Fatal(err)
		}
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, append(flags, "--pod-log-dir="+elsewhere)...)
		waitSynced(t, a)
		done, doneApp := stopped("done", "34a2-done")
		waitPassAfter(t, a, time.Now().Add(grace+time.Second), "known", removed("an empty --pod-log-dir, no pod running", doneApp, done.SandboxID))
		kept("an empty --pod-log-dir, no pod running", doneApp, done.SandboxID)
		a.Stop()

		// 2. The kubelet's dir: seen, then removed while the agent is away.
		a = testenv.StartAgent(t, c, state, flags...)
		waitSynced(t, a)
		waitPassAfter(t, a, time.Now(), "known", nil)
		waitSeen(t, state, filepath.Base(done.LogDir))
		lost, lostApp := stopped("lost", "34a2-lost")
		waitSeen(t, state, filepath.Base(lost.LogDir))
		a.Stop()
		if err := os.RemoveAll(done.LogDir); err != nil {
			t.Fatal(err)
		}
		restart := time.Now()
		a = testenv.StartAgent(t, c, state, flags...)
		testenv.Eventually(t, 60*time.Second, func() string {
			view := listCRIView(t, c, rt)
			if _, ok := view.criContainers[doneApp]; ok {
				return "the deleted pod's container is still there"
			}
			if _, ok := view.criSandboxes[done.SandboxID]; ok {
				return "the deleted pod's sandbox is still there"
			}
			return view.agree()
		})
		for _, id := range []string{doneApp, done.SandboxID} {
			if _, deleted := l.times(id); deleted.Sub(restart) < grace {
				t.Errorf("%s removed %s after the restart, before the grace %s", id, deleted.Sub(restart), grace)
			}
		}
		kept("a pod whose dir is there", lostApp, lost.SandboxID)
		a.Stop()

		// 3. The state lost: the dir seen before is no evidence.
		if err := os.RemoveAll(lost.LogDir); err != nil {
			t.Fatal(err)
		}
		a = testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), flags...)
		waitSynced(t, a)
		waitPassAfter(t, a, time.Now().Add(grace+time.Second), "known", removed("a dir gone while the agent's state was lost", lostApp, lost.SandboxID))
		kept("a dir gone while the agent's state was lost", lostApp, lost.SandboxID)
	})
}

// waitSeen waits until the agent has recorded the pod dir name as seen in
// its state dir.
func waitSeen(t *testing.T, state, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() string {
		var doc struct {
			Dirs map[string]json.RawMessage `json:"dirs"`
		}
		b, err := os.ReadFile(filepath.Join(state, "poddirs.json"))
		if err != nil {
			return err.Error()
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return err.Error()
		}
		if _, ok := doc.Dirs[name]; !ok {
			return fmt.Sprintf("%s not seen; seen %v", name, slices.Sorted(maps.Keys(doc.Dirs)))
		}
		return ""
	})
}
