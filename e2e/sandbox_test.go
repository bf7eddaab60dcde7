package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// TestSandboxAcrossRestart: a CRI container's pod sandbox, which only its
// spec names, is the same after a restart, where the agent takes it from
// its own projection instead of decoding the spec again (a container never
// changes sandbox); and a container deleted and created again under the
// same id while the agent was down (another creation time) is read afresh
// from its new spec. Periodic listings decode every spec.
func TestSandboxAcrossRestart(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Pause(c.SandboxImage),
			testenv.Runnable("example.test/app:1", testenv.Layer{Seed: "app", Size: 16 << 10}))
		pod := c.RunPod(t, rt, "web", "default", "5a1d-uid-web")
		app := c.RunPodContainer(t, rt, pod, "app", "example.test/app:1", "sleep", "600")

		// A record labelled like a kubelet's container (the labels name
		// its pod, only the spec its sandbox), made by a client, not CRI.
		record := func(sandbox string) {
			t.Helper()
			_, err := c.Client.ContainerService().Create(c.Ctx(), containers.Container{
				ID: "raw", Image: "example.test/app:1", Spec: spec(t, sandbox), Runtime: containers.RuntimeInfo{Name: "io.containerd.runc.v2"},
				Labels: map[string]string{
					"io.cri-containerd.kind": "container", "io.kubernetes.pod.uid": "raw-uid", "io.kubernetes.pod.name": "raw",
					"io.kubernetes.pod.namespace": "default", "io.kubernetes.container.name": "raw",
				}})
			if err != nil {
				t.Fatal(err)
			}
		}
		record("sb-before")
		want := map[string]string{app: pod.SandboxID, pod.SandboxID: pod.SandboxID, "raw": "sb-before"}
		sandboxes := func(a *testenv.Agent) {
			t.Helper()
			testenv.Eventually(t, 30*time.Second, func() string {
				var rep projection.Report
				if code, err := a.Get("/status", &rep); err != nil || code != 200 {
					return fmt.Sprintf("status: %d %v", code, err)
				}
				if !rep.Synced {
					return "not synced"
				}
				got := map[string]string{}
				for _, ct := range rep.Containers {
					got[ct.ID] = ct.SandboxID
				}
				for id, sb := range want {
					if got[id] != sb {
						return fmt.Sprintf("container %s in sandbox %q, want %q (all: %v)", id, got[id], sb, got)
					}
				}
				return ""
			})
		}
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, observeOnly...)
		sandboxes(a)
		a.Stop()

		// Restarted on its state: the same sandboxes, from the projection.
		// To tell where they come from, the record's spec names another
		// sandbox meanwhile (its id and creation time stay): the restarted
		// agent keeps the one it knew, as it does not decode the spec.
		raw, err := c.Client.ContainerService().Get(c.Ctx(), "raw")
		if err != nil {
			t.Fatal(err)
		}
		raw.Spec = spec(t, "sb-respecified")
		if _, err := c.Client.ContainerService().Update(c.Ctx(), raw, "spec"); err != nil {
			t.Fatal(err)
		}
		a = testenv.StartAgent(t, c, state, observeOnly...)
		sandboxes(a)
		a.Stop()

		// A periodic listing decodes every spec: what the projection knew
		// is read again (a fact a failed lookup missed is mended so).
		want["raw"] = "sb-respecified"
		a = testenv.StartAgent(t, c, state, append([]string{"--resync-interval=1s"}, observeOnly...)...)
		sandboxes(a)
		a.Stop()

		// The record made again under its id, in another sandbox.
		if err := c.Client.ContainerService().Delete(c.Ctx(), "raw"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // another creation time, whatever the clock's resolution
		record("sb-after")
		want["raw"] = "sb-after"
		a = testenv.StartAgent(t, c, state, observeOnly...)
		sandboxes(a)
	})
}

// spec is an OCI spec whose annotations say, as CRI's do, that it is a
// container of sandbox.
func spec(t *testing.T, sandbox string) typeurl.Any {
	t.Helper()
	a, err := typeurl.MarshalAny(&specs.Spec{Version: specs.Version, Annotations: map[string]string{
		"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": sandbox}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
