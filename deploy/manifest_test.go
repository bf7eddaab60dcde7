package deploy

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestManifestDecodesStrictly proves the strictness the other tests rely on:
// the shipped file decodes, and the same file with one unknown field or a
// misspelled one does not.
func TestManifestDecodesStrictly(t *testing.T) {
	if _, err := DecodeManifest(ManifestYAML); err != nil {
		t.Fatalf("deploy/kubernetes/gcagent.yaml: %v", err)
	}
	for name, mutate := range map[string]func(string) string{
		"unknown field in the pod spec": func(s string) string {
			return strings.Replace(s, "      hostNetwork: true\n", "      hostNetwork: true\n      hostNetwrk: true\n", 1)
		},
		"misspelled security context field": func(s string) string {
			return strings.Replace(s, "readOnlyRootFilesystem:", "readOnlyRootFileSystem:", 1)
		},
		"duplicate field": func(s string) string {
			return strings.Replace(s, "      hostNetwork: true\n", "      hostNetwork: true\n      hostNetwork: false\n", 1)
		},
		"unexpected kind": func(s string) string {
			return s + "\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: gcagent\n"
		},
	} {
		t.Run(name, func(t *testing.T) {
			mutated := mutate(string(ManifestYAML))
			if mutated == string(ManifestYAML) {
				t.Fatal("mutation did not apply")
			}
			if _, err := DecodeManifest([]byte(mutated)); err == nil {
				t.Error("decoded without error")
			} else {
				t.Log(err)
			}
		})
	}
}

// TestDaemonSetContract checks what the issue asks of the DaemonSet, on the
// decoded apps/v1 object.
func TestDaemonSetContract(t *testing.T) {
	m, err := DecodeManifest(ManifestYAML)
	if err != nil {
		t.Fatal(err)
	}
	pod := m.DaemonSet.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the ServiceAccount token must not be mounted (automountServiceAccountToken: false)")
	}
	if pod.ServiceAccountName != "" {
		t.Errorf("serviceAccountName %q: the agent needs no API access", pod.ServiceAccountName)
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", pod.PriorityClassName)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "" && tl.Operator == corev1.TolerationOpExists && tl.Effect == ""
	}) {
		t.Errorf("no toleration of every taint (operator Exists, no key, no effect): %+v", pod.Tolerations)
	}
	if sel, lbl := m.DaemonSet.Spec.Selector.MatchLabels, m.DaemonSet.Spec.Template.Labels; len(sel) == 0 || !mapIn(sel, lbl) {
		t.Errorf("selector %v does not match the template labels %v", sel, lbl)
	}
	c, err := m.AgentContainer()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Errorf("args %v: the first must be the run command", c.Args)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("no security context")
	case sc.Privileged == nil || *sc.Privileged:
		t.Error("privileged must be false")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation must be false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("readOnlyRootFilesystem must be true")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v: drop ALL, add none", sc.Capabilities)
	}
	if p := pod.SecurityContext; p == nil || p.SeccompProfile == nil || p.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod's seccomp profile must be RuntimeDefault")
	}
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Memory().IsZero() || req.Cpu().IsZero() || lim.Memory().IsZero() {
		t.Errorf("resources %+v: cpu and memory requests and a memory limit are needed", c.Resources)
	}
	if lim.Memory().Cmp(*req.Memory()) < 0 {
		t.Error("memory limit below the request")
	}
	if gml := envValue(c, "GOMEMLIMIT"); gml == "" {
		t.Error("no GOMEMLIMIT")
	} else if q, err := resource.ParseQuantity(strings.TrimSuffix(gml, "B")); err != nil || q.Cmp(*lim.Memory()) >= 0 {
		t.Errorf("GOMEMLIMIT %q must be below the memory limit %s (%v)", gml, lim.Memory(), err)
	}
	mounts, hosts, err := m.HostPaths()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{ // mount path -> writable
		"/run/containerd/containerd.sock": true, "/var/lib/containerd": false,
		"/var/log/containers": true, "/var/log/pods": true, "/var/lib/gcagent": true,
		"/var/lib/kubelet": false, // the kubelet's config's dir: it is read again when renamed over
	}
	for path, writable := range want {
		vm, ok := mounts[path]
		if !ok {
			t.Errorf("no mount of %s", path)
			continue
		}
		if hosts[path] != path {
			t.Errorf("%s mounts host path %s", path, hosts[path])
		}
		if vm.ReadOnly == writable {
			t.Errorf("%s: readOnly %v", path, vm.ReadOnly)
		}
	}
	for path := range mounts {
		if _, ok := want[path]; !ok {
			t.Errorf("unexpected mount %s: the DaemonSet mounts only what the agent needs", path)
		}
	}
	for _, p := range []string{"/var/log/containers", "/var/log/pods", "/var/lib/kubelet"} {
		if mp := mounts[p].MountPropagation; mp == nil || *mp != corev1.MountPropagationHostToContainer {
			t.Errorf("%s: mountPropagation must be HostToContainer, so mounts made later (and their unmounts) are seen", p)
		}
	}
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Error("readiness and liveness probes must be HTTP GETs on the metrics port")
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe on %s", c.ReadinessProbe.HTTPGet.Path)
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe on %s", c.LivenessProbe.HTTPGet.Path)
	}
	if envValue(c, "GCAGENT_METRICS_ADDRESS") == "" || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "GCAGENT_NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("the node name must come from spec.nodeName and the metrics address must be set")
	}
}

func mapIn(sub, super map[string]string) bool {
	for k, v := range sub {
		if super[k] != v {
			return false
		}
	}
	return true
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestDaemonSetStartupProbe: a startup probe on /readyz every second brings
// the pod to ready soon after the agent is (the kubelet asks for a
// readiness probe when the startup probe first succeeds); it allows
// minutes before a restart. The readiness probe runs every 2 s, as a probe
// worker made in the first period after the kubelet's start waits a random
// part of its period first (BenchmarkChartReadinessAtKubeletStart), and
// still makes the pod unready after 30 s of failures; the liveness probe
// keeps its period.
func TestDaemonSetStartupProbe(t *testing.T) {
	m, err := DecodeManifest(ManifestYAML)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.AgentContainer()
	if err != nil {
		t.Fatal(err)
	}
	sp := c.StartupProbe
	switch {
	case sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/readyz":
		t.Fatalf("startupProbe %+v: want an HTTP GET of /readyz", sp)
	case sp.PeriodSeconds != 1:
		t.Errorf("startupProbe periodSeconds %d, want 1", sp.PeriodSeconds)
	case sp.FailureThreshold*sp.PeriodSeconds < 120:
		t.Errorf("startupProbe allows %ds before a restart, want at least 120", sp.FailureThreshold*sp.PeriodSeconds)
	}
	if sp.HTTPGet.Port != c.ReadinessProbe.HTTPGet.Port {
		t.Errorf("startupProbe port %v, readiness %v", sp.HTTPGet.Port, c.ReadinessProbe.HTTPGet.Port)
	}
	rp := c.ReadinessProbe
	if rp.PeriodSeconds != 2 || rp.PeriodSeconds*rp.FailureThreshold != 30 || c.LivenessProbe.PeriodSeconds != 20 || c.LivenessProbe.FailureThreshold != 3 {
		t.Errorf("readiness period %d threshold %d, liveness period %d threshold %d: want 2, 15 (unready after 30 s as before), 20, 3",
			rp.PeriodSeconds, rp.FailureThreshold, c.LivenessProbe.PeriodSeconds, c.LivenessProbe.FailureThreshold)
	}
}
