package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/reference"
	"github.com/gcagent/gcagent/deploy"
	"github.com/gcagent/gcagent/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"sigs.k8s.io/yaml"
)

// chartPod is a render of the Helm chart (its DaemonSet and ConfigMap) as
// the static pod a standalone kubelet runs, with only the edits such a
// kubelet, or this shared machine, forces. Each edit is named where it is
// made and logged.
type chartPod struct {
	Pod *corev1.Pod
	// Metrics is the agent in the pod, at the address where it serves
	// /metrics, /readyz, /status and /plan.
	Metrics *testenv.Agent
	// Edits names every edit made to the render.
	Edits []string
}

// staticPodOf turns the DaemonSet of m into a static pod for k, with these
// edits and no other:
//
//   - a Pod of the DaemonSet's pod template, named and namespaced as the
//     DaemonSet (a kubelet without an API server runs static pods only);
//   - the ConfigMap of envFrom inlined as env before the container's own,
//     as the kubelet orders them (without an API server any configMapRef
//     fails, optional ones too);
//   - the probes' host set to the node's IP (a standalone kubelet reports
//     no pod IP, which probes default to; it fills the fieldRef
//     status.hostIP with the address of the default route's interface, as
//     ChooseHostInterface picks it, and the agent listens there);
//   - every hostPath volume pointed at the private daemon's or test's dir
//     that hostOf maps it to (the mount paths in the pod stay the chart's);
//   - the metrics port and the embedded NATS server's port: free ones (the
//     host network of this machine is shared with other tests).
//
// The image is the one `make image` built, imported into the daemon: the
// chart's default names it already (checked here).
func staticPodOf(t testing.TB, m deploy.Manifest, hostOf map[string]string, imageRef string) *chartPod {
	t.Helper()
	ds := m.DaemonSet
	cp := &chartPod{}
	edit := func(format string, a ...any) { cp.Edits = append(cp.Edits, fmt.Sprintf(format, a...)) }

	tmpl := ds.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: ds.Name, Namespace: ds.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec:       tmpl.Spec,
	}
	edit("static pod %s/%s of the DaemonSet's pod template", pod.Namespace, pod.Name)
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == "gcagent" })
	if i < 0 {
		t.Fatal("the DaemonSet has no gcagent container")
	}
	c := &pod.Spec.Containers[i]
	if named, err := reference.ParseNormalizedNamed(c.Image); err != nil || named.String() != imageRef {
		t.Fatalf("the chart's image %s (%v) is not the one make image built, %s", c.Image, err, imageRef)
	}

	var env []corev1.EnvVar
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil || m.ConfigMap == nil || ef.ConfigMapRef.Name != m.ConfigMap.Name {
			t.Fatalf("envFrom %+v: only the chart's ConfigMap is inlined here", ef)
		}
		keys := make([]string, 0, len(m.ConfigMap.Data))
		for k := range m.ConfigMap.Data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			env = append(env, corev1.EnvVar{Name: k, Value: m.ConfigMap.Data[k]})
		}
		edit("envFrom ConfigMap %s inlined as env (%d variables)", ef.ConfigMapRef.Name, len(keys))
	}
	c.EnvFrom = nil
	c.Env = append(env, c.Env...)

	for _, v := range pod.Spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		local, ok := hostOf[v.HostPath.Path]
		if !ok {
			t.Fatalf("volume %s: host path %s is not mapped to a private dir", v.Name, v.HostPath.Path)
		}
		edit("volume %s: host path %s -> %s", v.Name, v.HostPath.Path, local)
		v.HostPath.Path = local
	}

	nodeIP, err := utilnet.ChooseHostInterface()
	if err != nil {
		t.Fatalf("the node's IP, as a standalone kubelet picks it: %v", err)
	}
	port := c.Ports[0].ContainerPort
	_, free, _ := strings.Cut(testenv.FreeAddr(t), ":")
	n, _ := strconv.Atoi(free)
	c.Ports[0].ContainerPort = int32(n)
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		p.HTTPGet.Host = nodeIP.String()
		p.HTTPGet.Port = intstr.FromInt32(int32(n))
	}
	edit("probes: host %s (the node's IP; no pod IP is reported)", nodeIP)
	setEnv(t, c, "GCAGENT_METRICS_ADDRESS", func(v string) string {
		want := fmt.Sprintf("$(NODE_IP):%d", port)
		if v != want {
			t.Fatalf("GCAGENT_METRICS_ADDRESS %q, want %q", v, want)
		}
		return "$(NODE_IP):" + free // the kubelet expands $(NODE_IP)
	})
	pod.Annotations["prometheus.io/port"] = free
	edit("metrics port %d -> %d (containerPort, probes, GCAGENT_METRICS_ADDRESS, annotation)", port, n)
	nats := testenv.FreeAddr(t)
	c.Env = append(c.Env, corev1.EnvVar{Name: "GCAGENT_EMBEDDED_NATS_LISTEN", Value: nats})
	edit("GCAGENT_EMBEDDED_NATS_LISTEN=%s (4222 may be taken here)", nats)

	cp.Pod, cp.Metrics = pod, &testenv.Agent{Addr: net.JoinHostPort(nodeIP.String(), free)}
	return cp
}

// setEnv changes the value of the container's variable name.
func setEnv(t testing.TB, c *corev1.Container, name string, to func(string) string) {
	t.Helper()
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i].Value = to(c.Env[i].Value)
			return
		}
	}
	t.Fatalf("no variable %s", name)
}

// override sets variables of the agent's container, replacing those it
// has, and names the edit.
func (cp *chartPod) override(why string, vars map[string]string) {
	c := &cp.Pod.Spec.Containers[0]
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range vars {
			if !yield(k) {
				return
			}
		}
	}) {
		if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == k }); i >= 0 {
			c.Env[i] = corev1.EnvVar{Name: k, Value: vars[k]}
		} else {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: vars[k]})
		}
		cp.Edits = append(cp.Edits, fmt.Sprintf("%s=%s (%s)", k, vars[k], why))
	}
}

// put logs the edits and writes the pod as k's static pod.
func (cp *chartPod) put(t testing.TB, k *testenv.Kubelet) {
	t.Helper()
	t.Logf("the chart's render as a static pod, with these edits:\n  %s", strings.Join(cp.Edits, "\n  "))
	b, err := yaml.Marshal(cp.Pod)
	if err != nil {
		t.Fatal(err)
	}
	k.PutStaticPod(t, cp.Pod.Name, b)
}

// podReady waits until the static pod's agent container runs and is ready,
// and returns its CRI id.
func (cp *chartPod) podReady(t testing.TB, k *testenv.Kubelet, within time.Duration) string {
	t.Helper()
	p := k.WaitPod(t, cp.Pod.Namespace, cp.Pod.Name, within, func(p *corev1.Pod) string {
		s, ok := testenv.ContainerStatus(p, "gcagent")
		if !ok || s.State.Running == nil || !s.Ready {
			return fmt.Sprintf("gcagent not running and ready: %+v (restarts %d)", s.State, s.RestartCount)
		}
		return ""
	})
	s, _ := testenv.ContainerStatus(p, "gcagent")
	return strings.TrimPrefix(s.ContainerID, "containerd://")
}

// remove removes the static pod and waits until its agent container is
// no longer running.
func (cp *chartPod) remove(t *testing.T, k *testenv.Kubelet, id string) {
	t.Helper()
	k.RemoveStaticPod(t, cp.Pod.Name)
	testenv.Eventually(t, 2*time.Minute, func() string {
		r := k.Containerd.Crictl(t, time.Minute, "inspect", "-o", "go-template", "--template", "{{.status.state}}", id)
		if r.Code == 0 && strings.Contains(r.Stdout, "RUNNING") {
			return "the agent container " + id + " still runs"
		}
		return ""
	})
}

// checkLine is one line of `gcagent check`.
type checkLine struct{ status, detail string }

// execCheck runs `gcagent check` in the agent's container (crictl exec,
// as kubectl exec does through the kubelet) and returns its exit status
// and lines by check name.
func execCheck(t *testing.T, c *testenv.Containerd, id string) (int, map[string]checkLine, string) {
	t.Helper()
	r := c.Crictl(t, 2*time.Minute, "exec", id, "/gcagent", "check")
	lines := map[string]checkLine{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			lines[f[1]] = checkLine{f[0], strings.Join(f[2:], " ")}
		}
	}
	return r.Code, lines, r.Stdout + r.Stderr
}

// probeLine is the kubelet's log line of a probe result that changed, and
// addLine the one of pods it is given (at its start, a static pod file).
var (
	probeLine = regexp.MustCompile(`^I(\d{4} \d\d:\d\d:\d\d\.\d{6}) .*"SyncLoop \(probe\)" probe="(\w+)" status="([\w ]+)" pod="([^"]+)"`)
	addLine   = regexp.MustCompile(`^I(\d{4} \d\d:\d\d:\d\d\.\d{6}) .*"SyncLoop ADD" source="file" pods=\[([^]]*)\]`)
)

// podTimes is when the kubelet, in its log, was given the pod, when the
// pod's startup probe first succeeded, and when it was first ready (zero:
// not yet).
type podTimes struct{ added, started, ready time.Time }

// probeTimes reads the kubelet's log from byte offset on for the pod's
// times.
func probeTimes(t testing.TB, k *testenv.Kubelet, offset int64, pod string) podTimes {
	t.Helper()
	f, err := os.Open(k.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		t.Fatal(err)
	}
	var pt podTimes
	at := func(s string) time.Time {
		tm, err := time.Parse("0102 15:04:05.000000", s)
		if err != nil {
			t.Fatalf("kubelet log time %q: %v", s, err)
		}
		return tm
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := addLine.FindStringSubmatch(sc.Text()); m != nil && strings.Contains(m[2], `"`+pod+`"`) && pt.added.IsZero() {
			pt.added = at(m[1])
		}
		m := probeLine.FindStringSubmatch(sc.Text())
		if m == nil || m[4] != pod {
			continue
		}
		switch {
		case m[2] == "startup" && m[3] == "started" && pt.started.IsZero():
			pt.started = at(m[1])
		case m[2] == "readiness" && m[3] == "ready" && pt.ready.IsZero():
			pt.ready = at(m[1])
		}
	}
	return pt
}

// logSize is the size of the kubelet's log now: probeTimes reads from it.
func logSize(t testing.TB, k *testenv.Kubelet) int64 {
	t.Helper()
	fi, err := os.Stat(k.LogFile)
	if err != nil {
		return 0
	}
	return fi.Size()
}
