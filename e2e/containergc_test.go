package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const gcImage = "example.test/app:1"

// lifecycle records, from containerd's own event stream, when each
// container's init process exited (the shim's exited_at) and when
// containerd deleted the container (the envelope's timestamp): the ground
// truth for removal latencies.
type lifecycle struct {
	mu        sync.Mutex
	exits     map[string]time.Time
	collected map[string]time.Time // task deletes: the client read the exit status
	deletes   map[string]time.Time
	seen      int
}

// followEvents calls fn with each envelope of the test namespace and its
// decoded event (nil when it does not decode) until the test ends; ended,
// if set, gets the error that ended the subscription first.
func followEvents(t testing.TB, c *testenv.Containerd, fn func(env *cdevents.Envelope, v any), ended func(error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(c.Ctx())
	t.Cleanup(cancel)
	envs, errs := c.Client.Subscribe(ctx, fmt.Sprintf(`namespace==%q`, testenv.Namespace))
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errs:
				if ended != nil {
					ended(err)
				}
				return
			case env := <-envs:
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					v = nil
				}
				fn(env, v)
			}
		}
	}()
}

// recordLifecycle records the daemon's events until the test ends. Call
// waitActive after causing an event to be sure the stream is live.
func recordLifecycle(t testing.TB, c *testenv.Containerd) *lifecycle {
	t.Helper()
	l := &lifecycle{exits: map[string]time.Time{}, collected: map[string]time.Time{}, deletes: map[string]time.Time{}}
	followEvents(t, c, func(env *cdevents.Envelope, v any) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.seen++
		switch e := v.(type) {
		case *apievents.TaskExit:
			if e.ID == "" || e.ID == e.ContainerID {
				l.exits[e.ContainerID] = e.ExitedAt.AsTime()
			}
		case *apievents.TaskDelete:
			if e.ID == "" || e.ID == e.ContainerID {
				l.collected[e.ContainerID] = env.Timestamp
			}
		case *apievents.ContainerDelete:
			l.deletes[e.ID] = env.Timestamp
		}
	}, nil)
	return l
}

// waitActive waits until the stream delivered at least one event.
func (l *lifecycle) waitActive(t testing.TB) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.seen == 0 {
			return "no containerd event seen yet"
		}
		return ""
	})
}

// times returns id's exit and delete times (zero if not seen).
func (l *lifecycle) times(id string) (exited, deleted time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exits[id], l.deletes[id]
}

// waitSynced waits until the agent's projection is synced.
func waitSynced(t testing.TB, a *testenv.Agent) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() string {
		var rep projection.Report
		if code, err := a.Get("/status", &rep); err != nil || code != 200 || !rep.Synced {
			return fmt.Sprintf("agent not synced (%d %v)", code, err)
		}
		return ""
	})
}

// nativeExists reports whether the container exists in containerd.
func nativeExists(t testing.TB, c *testenv.Containerd, id string) bool {
	t.Helper()
	_, err := c.Client.ContainerService().Get(c.Ctx(), id)
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatalf("get container %s: %v", id, err)
	}
	return err == nil
}

// assertRemovedOnTime waits for every id to be deleted and checks that each
// went no earlier than ttl and no later than ttl+slack after its exit, both
// as containerd stamped them, not counting the time containerd spent in the
// agent's delete calls past the due time (a's removed lines).
func assertRemovedOnTime(t *testing.T, c *testenv.Containerd, a *testenv.Agent, l *lifecycle, ttl, slack time.Duration, ids ...string) {
	t.Helper()
	testenv.Eventually(t, ttl+20*time.Second, func() string {
		for _, id := range ids {
			if ex, del := l.times(id); ex.IsZero() || del.IsZero() {
				return fmt.Sprintf("%s: exited %v, deleted %v", id, !ex.IsZero(), !del.IsZero())
			}
		}
		return ""
	})
	// Each delete call's span, from the agent's removed line (its time
	// and delete_call_s). A task delete can take containerd and runc a
	// second (seen on 1.6 and 2.3 for the first `true` container), and
	// the agent deletes one container at a time, so one due during
	// another's slow call waits for it: every call's time within a
	// container's window from due to deleted is containerd's, not the
	// agent's lateness.
	type call struct{ start, end time.Time }
	calls := map[string]call{}
	for _, line := range agentLogLines(t, a) {
		if line["message"] == "removed" && line["component"] == "containergc" {
			id, _ := line["container"].(string)
			s, _ := line["delete_call_s"].(float64)
			end, err := time.Parse(time.RFC3339Nano, fmt.Sprint(line["time"]))
			if id != "" && err == nil {
				calls[id] = call{end.Add(-time.Duration(s * float64(time.Second))), end}
			}
		}
	}
	for _, id := range ids {
		ex, del := l.times(id)
		lat := del.Sub(ex)
		own, logged := calls[id]
		var containerds time.Duration // containerd's calls' time from due to deleted
		for _, o := range calls {
			from, to := later(o.start, ex.Add(ttl)), earlier(o.end, del)
			containerds += max(to.Sub(from), 0)
		}
		t.Logf("%s: removed %s after its exit (TTL %s), its delete call %s; containerd's calls took %s of the time past due",
			id, lat.Round(time.Millisecond), ttl, own.end.Sub(own.start).Round(time.Millisecond), containerds.Round(time.Millisecond))
		if lat < ttl {
			t.Errorf("%s removed %s after its exit, before its TTL %s", id, lat, ttl)
		}
		if !logged {
			t.Errorf("%s: the agent logged no removed line with its delete call's time", id)
		}
		// The log's times have millisecond precision: a few more.
		if lat > ttl+slack+containerds+5*time.Millisecond {
			t.Errorf("%s removed %s after its exit: more than %s after its TTL %s that was not containerd's (its calls took %s of it)", id, lat, slack, ttl, containerds)
		}
		if nativeExists(t, c, id) {
			t.Errorf("%s still in containerd", id)
		}
	}
}

// assertStays checks that the running and the never-started containers are
// still there, in their state.
func assertStays(t *testing.T, c *testenv.Containerd, running, created string) {
	t.Helper()
	ctx := c.Ctx()
	for _, id := range []string{running, created} {
		if !nativeExists(t, c, id) {
			t.Errorf("%s was removed", id)
		}
	}
	ctr, err := c.Client.LoadContainer(ctx, running)
	if err != nil {
		return
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Errorf("%s lost its task: %v", running, err)
		return
	}
	if st, err := task.Status(ctx); err != nil || st.Status != "running" {
		t.Errorf("%s: %v %v", running, st.Status, err)
	}
}

// TestContainerGCNativeTTL: plain containers whose exits nobody collects
// are removed through containerd within a second of the uncollected-exit
// grace plus their TTL, measured from containerd's exit time to
// containerd's delete, with the default per-unit cap (it does not apply to
// plain containers); a running and a never-started container stay. Then the
// same with TTL 0: removed within a second of exit plus grace. containerd's
// own time for the delete call (the agent logs it as delete_call_s) is not
// counted in that second.
func TestContainerGCNativeTTL(t *testing.T) {
	// Not parallel: it asserts removals within a second of their due time,
	// which a machine busy with other tests' imports may miss.
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		l := recordLifecycle(t, c)
		c.Import(t, testenv.Runnable(gcImage))
		l.waitActive(t)
		c.RunNative(t, "keep-running", gcImage, "sleep", "600")
		c.CreateNative(t, "keep-created", gcImage, "true")

		const ttl, grace = 2 * time.Second, time.Second
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--minimum-container-ttl-duration="+ttl.String(), "--uncollected-exit-grace="+grace.String())
		waitSynced(t, a)
		// Exits spread over a second: the one timer is re-armed in between.
		c.RunNative(t, "ttl-a", gcImage, "true")
		c.RunNative(t, "ttl-b", gcImage, "sh", "-c", "sleep 1")
		c.RunNative(t, "ttl-c", gcImage, "sh", "-c", "sleep 0.3; exit 7")
		assertRemovedOnTime(t, c, a, l, grace+ttl, time.Second, "ttl-a", "ttl-b", "ttl-c")
		assertStays(t, c, "keep-running", "keep-created")
		m := mustMetrics(t, a)
		for _, want := range []string{
			`gcagent_container_gc_containers_removed_total{kind="native",namespace="k8s.io",reason="ttl-expired"} 3`,
			`gcagent_container_gc_removal_duration_seconds_count{kind="native"} 3`,
		} {
			if !containsLine(m, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
		a.Stop()

		a0 := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state0"), "--uncollected-exit-grace="+grace.String())
		waitSynced(t, a0)
		c.RunNative(t, "zero-a", gcImage, "true")
		c.RunNative(t, "zero-b", gcImage, "sh", "-c", "sleep 0.5; exit 1")
		assertRemovedOnTime(t, c, a0, l, grace, time.Second, "zero-a", "zero-b")
		assertStays(t, c, "keep-running", "keep-created")
	})
}

// TestContainerGCDryRunDeletesNothing: with --dry-run the agent decides the
// same removals and deletes nothing.
func TestContainerGCDryRunDeletesNothing(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[0]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable(gcImage))
	a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--dry-run", "--uncollected-exit-grace=1s")
	waitSynced(t, a)
	ctr := c.RunNative(t, "dry-a", gcImage, "true")
	c.WaitExit(t, ctr)
	testenv.Eventually(t, 10*time.Second, func() string {
		b, _ := os.ReadFile(a.LogFile)
		if !strings.Contains(string(b), `"message":"would remove"`) {
			return "no 'would remove' logged"
		}
		return ""
	})
	if !nativeExists(t, c, "dry-a") {
		t.Fatal("dry run deleted dry-a")
	}
}

// waitCRIExited waits until CRI reports the container exited.
func waitCRIExited(t testing.TB, c *testenv.Containerd, rt runtime.RuntimeServiceClient, id string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() string {
		resp, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return err.Error()
		}
		if resp.Status.State != runtime.ContainerState_CONTAINER_EXITED {
			return fmt.Sprintf("%s is %s", id, resp.Status.State)
		}
		return ""
	})
}

// criView lists what CRI and containerd hold, by CRI kind.
type criView struct {
	criContainers, cdContainers map[string]runtime.ContainerState // cd: state unknown (0)
	criSandboxes, cdSandboxes   map[string]runtime.PodSandboxState
}

func listCRIView(t testing.TB, c *testenv.Containerd, rt runtime.RuntimeServiceClient) criView {
	t.Helper()
	ctx := c.Ctx()
	v := criView{criContainers: map[string]runtime.ContainerState{}, cdContainers: map[string]runtime.ContainerState{},
		criSandboxes: map[string]runtime.PodSandboxState{}, cdSandboxes: map[string]runtime.PodSandboxState{}}
	cs, err := rt.ListContainers(ctx, &runtime.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range cs.Containers {
		v.criContainers[ct.Id] = ct.State
	}
	ss, err := rt.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss.Items {
		v.criSandboxes[s.Id] = s.State
	}
	all, err := c.Client.ContainerService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range all {
		switch ct.Labels["io.cri-containerd.kind"] {
		case "container":
			v.cdContainers[ct.ID] = 0
		case "sandbox":
			v.cdSandboxes[ct.ID] = 0
		}
	}
	return v
}

// agree reports how CRI and containerd disagree ("" if they do not): a CRI
// container or sandbox containerd does not have is a stale CRI entry, the
// converse an object deleted behind CRI's back.
func (v criView) agree() string {
	keys := func(m any) []string {
		var out []string
		switch m := m.(type) {
		case map[string]runtime.ContainerState:
			for k := range m {
				out = append(out, k)
			}
		case map[string]runtime.PodSandboxState:
			for k := range m {
				out = append(out, k)
			}
		}
		sort.Strings(out)
		return out
	}
	if a, b := keys(v.criContainers), keys(v.cdContainers); !slices.Equal(a, b) {
		return fmt.Sprintf("containers: CRI %v, containerd %v", a, b)
	}
	if a, b := keys(v.criSandboxes), keys(v.cdSandboxes); !slices.Equal(a, b) {
		return fmt.Sprintf("sandboxes: CRI %v, containerd %v", a, b)
	}
	return ""
}

// TestContainerGCCRIPods: with --prune-containers=all, a pod created like a
// kubelet keeps exactly its newest dead run of a restarting container (cap
// 1) and its running container; the stopped sandbox of a deleted pod (its
// log dir gone for --pod-log-grace) goes, through CRI; CRI and containerd
// agree afterwards.
func TestContainerGCCRIPods(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--prune-containers=all", "--maximum-dead-containers-per-container=1", "--pod-log-grace=1s",
			"--kubelet-status-lag=1s") // no kubelet shows the previous attempts
		waitSynced(t, a)

		web := c.RunPod(t, rt, "web", "default", "7a0c3f6e-web")
		server := c.RunPodContainerAttempt(t, rt, web, "server", 0, gcImage, "sleep", "600")
		var jobs []string
		for i := range uint32(4) {
			id := c.RunPodContainerAttempt(t, rt, web, "job", i, gcImage, "sh", "-c", fmt.Sprintf("exit %d", i+1))
			waitCRIExited(t, c, rt, id)
			jobs = append(jobs, id)
		}
		newest := jobs[len(jobs)-1]

		batch := c.RunPod(t, rt, "batch", "default", "2b9d1e44-batch")
		once := c.RunPodContainerAttempt(t, rt, batch, "once", 0, gcImage, "true")
		waitCRIExited(t, c, rt, once)
		// The kubelet deletes the finished pod: it removes the containers,
		// stops the sandbox and removes the pod's log dir; removing the
		// sandbox is left to GC (a pod whose log dir is still there keeps
		// its newest sandbox).
		ctx := c.Ctx()
		if _, err := rt.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: once}); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: batch.SandboxID}); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(batch.LogDir); err != nil {
			t.Fatal(err)
		}

		testenv.Eventually(t, 20*time.Second, func() string {
			view := listCRIView(t, c, rt)
			want := []string{newest, server}
			var got []string
			for id := range view.criContainers {
				got = append(got, id)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				return fmt.Sprintf("CRI containers %v, want %v (server and the newest job)", got, want)
			}
			if _, ok := view.criSandboxes[batch.SandboxID]; ok {
				var rep projection.Report
				_, _ = a.Get("/status", &rep)
				for _, ct := range rep.Containers {
					if ct.ID == batch.SandboxID {
						return fmt.Sprintf("batch sandbox still listed by CRI; the agent sees it %s", ct.State)
					}
				}
				return "batch sandbox still listed by CRI; the agent does not know it"
			}
			return view.agree()
		})

		view := listCRIView(t, c, rt)
		if st := view.criSandboxes[web.SandboxID]; st != runtime.PodSandboxState_SANDBOX_READY {
			t.Errorf("web sandbox is %v, want ready", st)
		}
		if st := view.criContainers[server]; st != runtime.ContainerState_CONTAINER_RUNNING {
			t.Errorf("server is %v, want running", st)
		}
		if st := view.criContainers[newest]; st != runtime.ContainerState_CONTAINER_EXITED {
			t.Errorf("newest job is %v, want exited", st)
		}
		// The agent counts a removal right after CRI's call returns, which
		// the listing above may see first: wait for the counts.
		testenv.Eventually(t, 10*time.Second, func() string {
			m := mustMetrics(t, a)
			for _, want := range []string{
				`gcagent_container_gc_containers_removed_total{kind="container",namespace="k8s.io",reason="per-unit-cap"} 3`,
				`gcagent_container_gc_containers_removed_total{kind="sandbox",namespace="k8s.io",reason="pod-deleted"} 1`,
			} {
				if !containsLine(m, want) {
					return fmt.Sprintf("metrics lack %q", want)
				}
			}
			return ""
		})
	})
}

// containsLine reports whether text has line as one of its lines.
func containsLine(text, line string) bool {
	return slices.Contains(strings.Split(text, "\n"), line)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
