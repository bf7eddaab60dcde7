package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/gcagent/gcagent/deploy"
	"github.com/gcagent/gcagent/internal/testenv"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// procStatus returns the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// chartCollects runs the default render as the kubelet's static pod with
// a policy sized to the private disk and an external NATS server (the
// edits the CRI pod driven like a kubelet made, which this replaces):
// inside the pod, the agent deletes an image under disk pressure, prunes a
// dead container, removes a dangling log link, keeps a link whose target
// exists on the host at a path the pod does not see, and publishes each
// action to NATS exactly once; its process really runs as the chart says
// (no capabilities, no_new_privs, seccomp, root), within the memory the
// chart requests.
func chartCollects(t *testing.T, c *testenv.Containerd, k *testenv.Kubelet, m deploy.Manifest, image string) {
	ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	nc := natsConn(t, ns.ClientURL())
	rt, _ := c.CRI(t)
	version := image[strings.LastIndex(image, ":")+1:]

	// Workload: a job image whose container is created now and runs later,
	// then an unused image that pushes the disk over the high threshold
	// (the sandbox image is the kubelet's).
	c.Import(t, testenv.Runnable("example.test/job:1"))
	job := c.CreateNative(t, "dead-job", "example.test/job:1", "sh", "-c", "exit 3")
	u0 := usagePercent(t, c.Root)
	const victim = "example.test/victim:1"
	c.Import(t, testenv.Image{Name: victim, Layers: []testenv.Layer{{Seed: "victim", Size: 24 << 20}}})
	u1 := usagePercent(t, c.Root)
	if u1-u0 < 4 {
		t.Fatalf("the victim image moved usage only from %d%% to %d%%", u0, u1)
	}
	high, low := u1, (u0+u1)/2
	t.Logf("usage %d%% without the victim, %d%% with it: high threshold %d%%, low %d%%", u0, u1, high, low)

	cp := staticPodOf(t, m, hostPaths(t, c, k), image)
	cp.override("the test's policy, sized to its disk, and its NATS server", map[string]string{
		"GCAGENT_NATS_URL":                   ns.ClientURL(),
		"GCAGENT_IMAGE_GC_HIGH_THRESHOLD":    strconv.Itoa(high),
		"GCAGENT_IMAGE_GC_LOW_THRESHOLD":     strconv.Itoa(low),
		"GCAGENT_MINIMUM_IMAGE_TTL_DURATION": "0s",
		"GCAGENT_UNCOLLECTED_EXIT_GRACE":     "1s", // nobody collects the job's exit here
		"GCAGENT_POD_LOG_GRACE":              "1s", // a link of an unknown container waits this long
		// The links name the host's pod log dir, which the pod sees at
		// /var/log/pods: what a chart sets where the host path differs.
		"GCAGENT_HOST_POD_LOG_DIR": c.PodLogDir,
	})
	cp.put(t, k)
	agentID := cp.podReady(t, k, 3*time.Minute)
	a := cp.Metrics
	st, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: agentID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	agentLog := st.Status.LogPath
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(agentLog)
			t.Logf("agent container log tail:\n%s", tail(string(b), 30))
		}
	})

	// Under pressure since its start: the victim goes, nothing else.
	testenv.Eventually(t, 30*time.Second, func() string {
		if !imageGone(t, c, victim) {
			return "victim image still there (usage " + strconv.Itoa(usagePercent(t, c.Root)) + "%)"
		}
		return ""
	})
	for _, keep := range []string{image, c.SandboxImage, "example.test/job:1"} {
		if imageGone(t, c, keep) {
			t.Errorf("image %s was deleted", keep)
		}
	}

	// A job runs and exits: the agent prunes it.
	task, err := job.NewTask(c.Ctx(), cio.NullIO)
	if err == nil {
		err = task.Start(c.Ctx())
	}
	if err != nil {
		t.Fatalf("start dead-job: %v", err)
	}
	// A link whose target exists on the host, at a path the pod does not
	// see (issue 27): kept, though its container is unknown.
	hostLink := c.LogDir + "/shipper_default_app-fedcba9876543210.log"
	mustSymlink(t, agentLog, hostLink)
	// A dangling one: its file is missing from a dir the agent sees (the
	// pod's own log dir, mounted in the agent's pod).
	link := danglingLogIn(t, c, filepath.Dir(filepath.Dir(agentLog)), "ghost", "0123456789abcdef")
	testenv.Eventually(t, 30*time.Second, func() string {
		switch {
		case !containerGone(t, c, "dead-job"):
			return "dead-job not pruned"
		case exists(link):
			return "dangling log link still there"
		}
		return ""
	})
	if !exists(hostLink) {
		t.Errorf("the agent in the pod removed %s, whose target exists on the host", hostLink)
	}

	// Each action on NATS, exactly once, with the documented fields.
	var evs []storedEvent
	testenv.Eventually(t, 30*time.Second, func() string {
		evs = readStream(t, nc)
		types := checkTypes(evs)
		if types["image.removed"] < 1 || types["container.removed"] < 1 || types["log.removed"] < 1 {
			return fmt.Sprintf("events so far: %v", types)
		}
		return ""
	})
	checkContract(t, evs)
	var victimRemoved, started bool
	for _, ev := range evs {
		var data struct {
			Names   []string `json:"names"`
			Version string   `json:"version"`
		}
		_ = json.Unmarshal(ev.Data, &data)
		switch ev.KindAction {
		case "image.removed":
			victimRemoved = victimRemoved || slices.Contains(data.Names, victim)
		case "agent.started":
			started = true
			if data.Version != version {
				t.Errorf("agent.started says version %q, the image is %q", data.Version, version)
			}
		case "container.removed":
			if ev.Subject != "dead-job" {
				t.Errorf("container.removed for %s", ev.Subject)
			}
		}
	}
	if !victimRemoved || !started {
		t.Errorf("victim image.removed %v, agent.started %v", victimRemoved, started)
	}

	// The process really runs as the chart says, within its memory.
	st, err = rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: agentID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtime.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("agent container %s", st.Status.State)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("agent pid from CRI: %v %s", err, st.Info["info"])
	}
	ps := procStatus(t, info.Pid)
	for k, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0"} {
		if ps[k] != want {
			t.Errorf("agent process %s = %q, want %q", k, ps[k], want)
		}
	}
	ctr := cp.Pod.Spec.Containers[0]
	text, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	rss := metricSum(text, "process_resident_memory_bytes")
	stats, err := rt.ContainerStats(c.Ctx(), &runtime.ContainerStatsRequest{ContainerId: agentID})
	if err != nil {
		t.Fatal(err)
	}
	ws := int64(stats.Stats.GetMemory().GetWorkingSetBytes().GetValue())
	req, memLimit := ctr.Resources.Requests.Memory().Value(), ctr.Resources.Limits.Memory().Value()
	t.Logf("agent in the kubelet's pod: RSS %.1f MiB, working set %.1f MiB (request %d MiB, limit %d MiB), %d events",
		rss/(1<<20), float64(ws)/(1<<20), req>>20, memLimit>>20, len(evs))
	if rss <= 0 || int64(rss) > memLimit/2 {
		t.Errorf("RSS %.0f bytes: the limit %d should leave at least half as headroom", rss, memLimit)
	}
	if ws > memLimit {
		t.Errorf("working set %d above the limit %d", ws, memLimit)
	}
	cp.remove(t, k, agentID)
}
