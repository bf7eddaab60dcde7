package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deploy"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/testenv"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// kubeletConfigSource is the source of a setting the agent in the chart's
// pod took from the kubelet's config, at the path the chart mounts.
const kubeletConfigSource = "kubelet-config /var/lib/kubelet/config.yaml"

// TestChartOnKubelet: the Helm chart's default render
// (deploy/kubernetes/gcagent.yaml, which `make chart` checks is the render)
// runs as the static pod of the real kubelet v1.37.2, with only the edits a
// kubelet without an API server and this shared machine force
// (staticPodOf names and logs each), on containerd 1.6 and 2.3:
//
//   - at the node's boot (the kubelet starts with the pod in its static pod
//     dir), the pod becomes Ready within a readiness period of its startup
//     probe (measured from the kubelet's log);
//   - the kubelet's config at 70/20 gives the agent 70/20 (/status, from
//     "kubelet-config /var/lib/kubelet/config.yaml"), and the agent says the
//     kubelet's image GC is on (/readyz, gauge, check in the pod);
//   - `gcagent check` and `gcagent plan` run in the pod (crictl exec, as
//     kubectl exec) see what run sees: check exits 0, plan is the agent's;
//   - no image-fs warning though CRI's image filesystem, a host path, is
//     not seen from the pod;
//   - the handover (the kubelet's config renamed over with 100, the kubelet
//     restarted) is seen by the same agent, not restarted: /readyz, the
//     gauge and check follow, the policy stays 70/20 until its next start;
//   - the chart rendered for a k3s/RKE2-style node (deploy/helm/testdata)
//     runs too, and check in it exits 0 with its paths;
//   - and, moved from the CRI pod driven like a kubelet that this replaces:
//     the agent in the pod deletes an image under disk pressure, prunes a
//     dead container, removes a dangling log link, keeps one whose target
//     it cannot see, publishes each action once to NATS, and runs without
//     capabilities, with no_new_privs and seccomp, within its memory.
func TestChartOnKubelet(t *testing.T) {
	t.Parallel()
	def, err := deploy.DecodeManifest(deploy.ManifestYAML)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "helm", "testdata", "k3s.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k3s, err := deploy.DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	img := testenv.AgentImage(t)
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		var k *testenv.Kubelet
		cgroupsGoneAfter(t, func() *testenv.Kubelet { return k })
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "256m"})
		if names := c.ImportArchive(t, img.Path); !slices.Contains(names, img.Ref) {
			t.Fatalf("import named %v, want %s", names, img.Ref)
		}
		// The node name is the one checkContract expects in events: the
		// agent takes it from the pod's spec.nodeName (a fieldRef the
		// kubelet fills).
		k = testenv.StartKubelet(t, c, testenv.KubeletOptions{NodeName: natsNode, ImageGCHighThresholdPercent: 70, ImageGCLowThresholdPercent: 20})
		chartDefaultLayout(t, c, k, def, img.Ref)
		chartK3sLayout(t, c, k, k3s, img.Ref)
		chartCollects(t, c, k, def, img.Ref)
	})
}

// hostPaths maps the chart's default host paths to the private ones.
func hostPaths(t testing.TB, c *testenv.Containerd, k *testenv.Kubelet) map[string]string {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"/run/containerd/containerd.sock": c.Address,
		"/var/lib/containerd":             c.Root,
		"/var/log/containers":             c.LogDir,
		"/var/log/pods":                   c.PodLogDir,
		"/var/lib/gcagent":                state,
		"/var/lib/kubelet":                k.RootDir, // holds k.ConfigPath, config.yaml, as kubeadm's
	}
}

// chartDefaultLayout: the default render at the node's boot, 70/20 taken
// from the kubelet's config, check and plan in the pod, then the handover.
func chartDefaultLayout(t *testing.T, c *testenv.Containerd, k *testenv.Kubelet, m deploy.Manifest, image string) {
	cp := staticPodOf(t, m, hostPaths(t, c, k), image)
	a := cp.Metrics
	// The node boots: the kubelet starts with the pod in its static pod dir.
	k.Stop()
	cp.put(t, k)
	off := logSize(t, k)
	k.Start()
	id := cp.podReady(t, k, 3*time.Minute)
	startupToReady(t, k, off, cp)
	// The kubelet filled the fieldRefs and expanded $(NODE_IP).
	env := containerEnv(t, c, id)
	if env["GCAGENT_METRICS_ADDRESS"] != a.Addr || env["GCAGENT_NODE_NAME"] != k.NodeName {
		t.Errorf("the kubelet gave GCAGENT_METRICS_ADDRESS=%q GCAGENT_NODE_NAME=%q; want %q (the node's IP) and %q",
			env["GCAGENT_METRICS_ADDRESS"], env["GCAGENT_NODE_NAME"], a.Addr, k.NodeName)
	}

	pol := agentPolicy(t, a)
	for name, want := range map[string]string{"image-gc-high-threshold": "70%", "image-gc-low-threshold": "20%"} {
		if s := pol[name]; s.Value != want || s.Source != kubeletConfigSource {
			t.Errorf("/status %s = %s from %q, want %s from %q", name, s.Value, s.Source, want, kubeletConfigSource)
		}
	}
	kubeletSays(t, a, true)
	code, lines, out := execCheck(t, c, id)
	if code != 0 {
		t.Errorf("check in the pod: exit %d\n%s", code, out)
	}
	for name, want := range map[string]checkLine{
		"containerd":     {"OK", "/run/containerd/containerd.sock"},
		"image-fs":       {"OK", "/var/lib/containerd"},
		"pod-log-dir":    {"OK", "/var/log/pods"},
		"state-dir":      {"OK", "/var/lib/gcagent"},
		"kubelet-config": {"WARN", "imageGCHighThresholdPercent 70"},
		"nats":           {"OK", "embedded server at nats://127.0.0.1:"},
	} {
		if got := lines[name]; got.status != want.status || !strings.Contains(got.detail, want.detail) {
			t.Errorf("check in the pod: %s %s %q; want %s with %q\n%s", got.status, name, got.detail, want.status, want.detail, out)
		}
	}
	planIsAgents(t, c, id, pol)
	noImageFSWarning(t, k, a, cp)

	// The handover: the kubelet's config renamed over (a new inode, which a
	// single-file mount would not show), the kubelet restarted.
	k.EditConfig(t, func(cfg *kubeletv1beta1.KubeletConfiguration) {
		off := int32(100)
		cfg.ImageGCHighThresholdPercent = &off
	})
	off = logSize(t, k)
	k.Restart()
	kubeletSays(t, a, false)
	if again := cp.podReady(t, k, 3*time.Minute); again != id {
		t.Errorf("the agent container is %s after the handover, was %s", again, id)
	}
	p, _ := k.Pod(t, cp.Pod.Namespace, cp.Pod.Name)
	if s, _ := testenv.ContainerStatus(p, "gcagent"); s.RestartCount != 0 {
		t.Errorf("the agent restarted %d times", s.RestartCount)
	}
	restartToReady(t, k, off, cp)
	code, lines, out = execCheck(t, c, id)
	if l := lines["kubelet-config"]; code != 0 || l.status != "OK" || !strings.Contains(l.detail, "the kubelet's image GC is off") {
		t.Errorf("check in the pod after the handover: exit %d, kubelet-config %s %q\n%s", code, l.status, l.detail, out)
	}
	// The policy stays until the agent's next start, and says so.
	pol = agentPolicy(t, a)
	if s := pol["image-gc-high-threshold"]; s.Value != "70%" || s.Source != kubeletConfigSource {
		t.Errorf("/status high threshold %s from %q after the handover, want 70%% until the next start", s.Value, s.Source)
	}
	_, logs := k.ContainerLogs(t, cp.Pod.Namespace, cp.Pod.Name, "gcagent", false)
	if !strings.Contains(logs, "kubelet config changed: the kubelet's image GC is handed over; the agent's policy stays until its next start, which takes image-gc-high-threshold 85% (now 70%)") {
		t.Errorf("the agent's log does not say what the handover means:\n%s", tail(logs, 10))
	}
	planIsAgents(t, c, id, pol)
	cp.remove(t, k, id)
}

// chartK3sLayout: the chart rendered for a k3s/RKE2-style node; check in
// its pod sees its paths and exits 0, plan sees its keep patterns.
func chartK3sLayout(t *testing.T, c *testenv.Containerd, k *testenv.Kubelet, m deploy.Manifest, image string) {
	hostOf := hostPaths(t, c, k)
	for from, to := range map[string]string{
		"/run/containerd/containerd.sock": "/run/k3s/containerd/containerd.sock",
		"/var/lib/containerd":             "/var/lib/rancher/k3s/agent/containerd",
		"/var/log/pods":                   "/var/log/k3s/pods",
	} {
		hostOf[to] = hostOf[from]
		delete(hostOf, from)
	}
	cp := staticPodOf(t, m, hostOf, image)
	cp.put(t, k)
	id := cp.podReady(t, k, 3*time.Minute)
	code, lines, out := execCheck(t, c, id)
	if code != 0 {
		t.Errorf("check in the k3s-style pod: exit %d\n%s", code, out)
	}
	for name, want := range map[string]checkLine{
		"containerd":  {"OK", "/run/containerd/containerd.sock"},
		"image-fs":    {"OK", "/var/lib/containerd"},
		"pod-log-dir": {"OK", "/var/log/k3s/pods"},
		"state-dir":   {"OK", "/var/lib/gcagent"},
	} {
		if got := lines[name]; got.status != want.status || !strings.Contains(got.detail, want.detail) {
			t.Errorf("check in the k3s-style pod: %s %s %q; want %s with %q\n%s", got.status, name, got.detail, want.status, want.detail, out)
		}
	}
	pol := agentPolicy(t, cp.Metrics)
	if s := pol["keep-image"]; s.Value != "registry.k8s.io/*,docker.io/rancher/*" || s.Source != "env GCAGENT_KEEP_IMAGE" {
		t.Errorf("/status keep-image %q from %q", s.Value, s.Source)
	}
	// The kubelet's image GC is handed over now: its thresholds not taken.
	if s := pol["image-gc-high-threshold"]; s.Value != "85%" || s.Source != "default" {
		t.Errorf("/status high threshold %s from %q, want the agent's 85%% (the kubelet's is 100)", s.Value, s.Source)
	}
	planIsAgents(t, c, id, pol)
	noImageFSWarning(t, k, cp.Metrics, cp)
	cp.remove(t, k, id)
}

// startupToReady measures, in the kubelet's log from offset on, how long
// after its startup probe succeeded the pod became ready, and fails when
// that is more than its readiness period and a few seconds of slack. At a
// node's boot the container starts after the kubelet: readiness waits for
// the startup probe.
func startupToReady(t *testing.T, k *testenv.Kubelet, offset int64, cp *chartPod) {
	t.Helper()
	pt := waitProbeTimes(t, k, offset, cp, true)
	period := readinessPeriod(cp)
	d := pt.ready.Sub(pt.started)
	t.Logf("at the node's boot: ready %.3f s after the startup probe succeeded (readiness period %s)", d.Seconds(), period)
	if d < 0 || d > period+3*time.Second {
		t.Errorf("at the node's boot: ready %s after the startup probe, want from 0 to its period %s", d, period)
	}
}

// restartToReady measures, in the kubelet's log from offset on, how long
// after the restarted kubelet was given the pod (its container running
// on) the pod was ready again, and fails when that is more than the
// startup and readiness periods and a few seconds of slack. (A restarted
// kubelet may count the container started from its status and probe
// readiness before the startup probe.)
func restartToReady(t *testing.T, k *testenv.Kubelet, offset int64, cp *chartPod) {
	t.Helper()
	pt := waitProbeTimes(t, k, offset, cp, false)
	period := readinessPeriod(cp)
	d := pt.ready.Sub(pt.added)
	t.Logf("after the kubelet's restart: ready %.3f s after the kubelet was given the pod (readiness period %s)", d.Seconds(), period)
	if d > period+4*time.Second {
		t.Errorf("after the kubelet's restart: ready %s after it was given the pod, more than its readiness period %s", d, period)
	}
}

func readinessPeriod(cp *chartPod) time.Duration {
	return time.Duration(cp.Pod.Spec.Containers[0].ReadinessProbe.PeriodSeconds) * time.Second
}

// waitProbeTimes waits until the kubelet's log from offset on says when it
// was given the pod, when it was ready and, with started, when the startup
// probe succeeded.
func waitProbeTimes(t testing.TB, k *testenv.Kubelet, offset int64, cp *chartPod, started bool) podTimes {
	t.Helper()
	pod := cp.Pod.Namespace + "/" + k.StaticPodName(cp.Pod.Name)
	var pt podTimes
	testenv.Eventually(t, 2*time.Minute, func() string {
		if pt = probeTimes(t, k, offset, pod); pt.added.IsZero() || started && pt.started.IsZero() || pt.ready.IsZero() {
			return fmt.Sprintf("the kubelet's log for %s: given %v, started %v, ready %v", pod, pt.added, pt.started, pt.ready)
		}
		return ""
	})
	return pt
}

// agentPolicy is the agent's /status policy by name.
func agentPolicy(t *testing.T, a *testenv.Agent) map[string]agent.Setting {
	t.Helper()
	var doc agent.StatusDoc
	if code, err := a.Get("/status", &doc); code != 200 || err != nil {
		t.Fatalf("/status %d %v", code, err)
	}
	return policyOf(doc.Policy)
}

// kubeletSays waits until the agent says the kubelet's image GC is on (or
// off) in /readyz and the gauge.
func kubeletSays(t *testing.T, a *testenv.Agent, on bool) {
	t.Helper()
	gauge := map[bool]string{true: "gcagent_kubelet_image_gc_enabled 1", false: "gcagent_kubelet_image_gc_enabled 0"}[on]
	testenv.Eventually(t, time.Minute, func() string {
		code, body, err := a.GetText("/readyz")
		if err != nil || code != 200 {
			return fmt.Sprintf("/readyz %d %v %q", code, err, body)
		}
		if said := strings.Contains(body, "kubelet: the kubelet's own image GC is on"); said != on {
			return fmt.Sprintf("/readyz %q: want the kubelet's image GC said on: %v", body, on)
		}
		_, metrics, err := a.GetText("/metrics")
		if err != nil || !strings.Contains(metrics, "\n"+gauge+"\n") {
			return fmt.Sprintf("/metrics lacks %q (%v)", gauge, err)
		}
		return ""
	})
}

// planIsAgents runs `gcagent plan --json` in the pod: it asks the running
// agent and shows its policy, with no what-if.
func planIsAgents(t *testing.T, c *testenv.Containerd, id string, pol map[string]agent.Setting) {
	t.Helper()
	r := c.Crictl(t, 2*time.Minute, "exec", id, "/gcagent", "plan", "--json")
	var doc agent.Plan
	if err := json.Unmarshal([]byte(r.Stdout), &doc); r.Code != 0 || err != nil {
		t.Fatalf("plan in the pod: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	if doc.History != "agent" || len(doc.WhatIf) > 0 || strings.Contains(doc.HistoryNote, "not this command's") {
		t.Errorf("plan in the pod: history %q, what-if %v, note %q: want the running agent's own plan", doc.History, doc.WhatIf, doc.HistoryNote)
	}
	for name, s := range policyOf(doc.Policy) {
		// fleet-keep's source says how long ago the list was confirmed.
		if want, ok := pol[name]; ok && want != s && name != "fleet-keep" {
			t.Errorf("plan in the pod: %s %+v; /status %+v", name, s, want)
		}
	}
	if doc.ImageFS != "/var/lib/containerd" {
		t.Errorf("plan in the pod measures %s, want /var/lib/containerd", doc.ImageFS)
	}
}

// noImageFSWarning: CRI's image filesystem is a host path the pod does not
// see; unknown is not different, so neither /readyz nor the log warns.
func noImageFSWarning(t *testing.T, k *testenv.Kubelet, a *testenv.Agent, cp *chartPod) {
	t.Helper()
	if _, body, _ := a.GetText("/readyz"); strings.Contains(body, "image-fs") {
		t.Errorf("/readyz warns about the image filesystem: %q", body)
	}
	if _, logs := k.ContainerLogs(t, cp.Pod.Namespace, cp.Pod.Name, "gcagent", false); strings.Contains(logs, "not on CRI's image filesystem") {
		t.Errorf("the agent's log warns about the image filesystem:\n%s", tail(logs, 10))
	}
}

// containerEnv is the environment CRI gave container id, as the kubelet
// resolved it.
func containerEnv(t *testing.T, c *testenv.Containerd, id string) map[string]string {
	t.Helper()
	rt, _ := c.CRI(t)
	st, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Config struct {
			Envs []struct{ Key, Value string } `json:"envs"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("CRI info of %s: %v", id, err)
	}
	out := map[string]string{}
	for _, e := range info.Config.Envs {
		out[e.Key] = e.Value
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
