package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestContainerGCDeletedPod (issue 30): with --prune-containers=all and
// the default cap of one dead container per name, a pod whose container
// restarted three times (attempts 0 and 1 in its first sandbox, 2 and 3 in
// a second one, as when the kubelet recreates a pod's sandbox) keeps only
// its last dead container and its current sandbox while it lives: the
// first, empty sandbox goes though the pod still has a dead container.
// Then the pod is deleted as a kubelet deletes one (its sandbox stopped,
// its pod log dir removed): no sooner than --pod-log-grace later, no
// container and no sandbox of it is left, and no pod log dir. A live pod
// beside it keeps the last dead container of each container name and its
// running one. CRI and containerd agree at the end.
func TestContainerGCDeletedPod(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		l := recordLifecycle(t, c)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		l.waitActive(t)
		const grace = 3 * time.Second
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--prune-containers=all", "--maximum-dead-containers-per-container=1", "--pod-log-grace="+grace.String(),
			"--kubelet-status-lag=1s") // no kubelet shows the previous attempts
		waitSynced(t, a)
		ctx := c.Ctx()

		// A live pod: a running server, a job that restarted three times,
		// a sidecar that ran once.
		web := c.RunPod(t, rt, "web", "default", "30a1-web")
		server := c.RunPodContainerAttempt(t, rt, web, "server", 0, gcImage, "sleep", "600")
		var jobs []string
		for i := range uint32(4) {
			id := c.RunPodContainerAttempt(t, rt, web, "job", i, gcImage, "sh", "-c", fmt.Sprintf("exit %d", i+1))
			waitCRIExited(t, c, rt, id)
			jobs = append(jobs, id)
		}
		side := c.RunPodContainerAttempt(t, rt, web, "side", 0, gcImage, "true")
		waitCRIExited(t, c, rt, side)

		// The pod to delete: its container restarts three times, in two
		// sandboxes.
		gone := c.RunPod(t, rt, "gone", "default", "30a2-gone")
		first := gone.SandboxID
		var apps []string
		runApp := func(p *testenv.Pod, attempt uint32) {
			id := c.RunPodContainerAttempt(t, rt, p, "app", attempt, gcImage, "sh", "-c", "exit 3")
			waitCRIExited(t, c, rt, id)
			apps = append(apps, id)
		}
		runApp(gone, 0)
		runApp(gone, 1)
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: first}); err != nil {
			t.Fatal(err)
		}
		gone2 := newSandboxAttempt(t, c, rt, gone, 1)
		runApp(gone2, 2)
		runApp(gone2, 3)

		// While it lives: the last dead container of each name, the
		// pod's current sandbox; the first sandbox is empty and goes.
		want := []string{server, jobs[3], side, apps[3]}
		waitCRI(t, c, rt, want, []string{web.SandboxID, gone2.SandboxID})
		t.Logf("live: kept %v; removed the first sandbox and 6 older attempts", want)

		// The kubelet deletes the pod: it stops its sandbox and removes
		// its pod log dir (its own GC would remove the rest).
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: gone2.SandboxID}); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(gone.LogDir); err != nil {
			t.Fatal(err)
		}
		dirGone := time.Now()
		want = []string{server, jobs[3], side}
		waitCRI(t, c, rt, want, []string{web.SandboxID})
		for _, id := range []string{apps[3], gone2.SandboxID} {
			_, deleted := l.times(id)
			if deleted.IsZero() {
				t.Errorf("%s: no containerd delete event seen", id)
				continue
			}
			t.Logf("%s removed %s after its pod log dir (grace %s)", id, deleted.Sub(dirGone).Round(time.Millisecond), grace)
			if deleted.Sub(dirGone) < grace {
				t.Errorf("%s removed %s after its pod log dir went, before the grace %s", id, deleted.Sub(dirGone), grace)
			}
		}
		if _, err := os.Lstat(gone.LogDir); !os.IsNotExist(err) {
			t.Errorf("pod log dir %s: %v, want gone", gone.LogDir, err)
		}
		view := listCRIView(t, c, rt)
		if st := view.criContainers[server]; st != runtime.ContainerState_CONTAINER_RUNNING {
			t.Errorf("server is %v, want running", st)
		}
		if st := view.criSandboxes[web.SandboxID]; st != runtime.PodSandboxState_SANDBOX_READY {
			t.Errorf("web sandbox is %v, want ready", st)
		}
		testenv.Eventually(t, 10*time.Second, func() string {
			m := mustMetrics(t, a)
			for _, line := range []string{
				`gcagent_container_gc_containers_removed_total{kind="container",namespace="k8s.io",reason="per-unit-cap"} 6`,
				`gcagent_container_gc_containers_removed_total{kind="container",namespace="k8s.io",reason="pod-deleted"} 1`,
				`gcagent_container_gc_containers_removed_total{kind="sandbox",namespace="k8s.io",reason="sandbox-orphaned"} 1`,
				`gcagent_container_gc_containers_removed_total{kind="sandbox",namespace="k8s.io",reason="pod-deleted"} 1`,
			} {
				if !containsLine(m, line) {
					return fmt.Sprintf("metrics lack %q", line)
				}
			}
			return ""
		})
	})
}

// newSandboxAttempt runs the pod's next sandbox, as the kubelet does when
// it recreates a pod's sandbox (CRI reserves name+attempt).
func newSandboxAttempt(t *testing.T, c *testenv.Containerd, rt runtime.RuntimeServiceClient, p *testenv.Pod, attempt uint32) *testenv.Pod {
	t.Helper()
	q := *p
	q.Config = proto.Clone(p.Config).(*runtime.PodSandboxConfig)
	q.Config.Metadata.Attempt = attempt
	resp, err := rt.RunPodSandbox(c.Ctx(), &runtime.RunPodSandboxRequest{Config: q.Config})
	if err != nil {
		t.Fatalf("run pod %s sandbox attempt %d: %v\n%s", p.Name, attempt, err, c.LogTail(20))
	}
	q.SandboxID = resp.PodSandboxId
	return &q
}

// waitCRI waits until CRI lists exactly containers and sandboxes, and
// agrees with containerd.
func waitCRI(t *testing.T, c *testenv.Containerd, rt runtime.RuntimeServiceClient, containers, sandboxes []string) {
	t.Helper()
	containers, sandboxes = slices.Sorted(slices.Values(containers)), slices.Sorted(slices.Values(sandboxes))
	testenv.Eventually(t, 30*time.Second, func() string {
		view := listCRIView(t, c, rt)
		var cs, ss []string
		for id := range view.criContainers {
			cs = append(cs, id)
		}
		for id := range view.criSandboxes {
			ss = append(ss, id)
		}
		slices.Sort(cs)
		slices.Sort(ss)
		if !slices.Equal(cs, containers) || !slices.Equal(ss, sandboxes) {
			return fmt.Sprintf("CRI has containers %v and sandboxes %v, want %v and %v", cs, ss, containers, sandboxes)
		}
		return view.agree()
	})
}
