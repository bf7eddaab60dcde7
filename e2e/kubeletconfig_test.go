package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/testenv"
)

// kubeletConfigs are real KubeletConfiguration files as a node has them:
// the kubelet's defaults (kubeadm writes little more), image GC handed
// over (high 100), and image GC on with hard eviction at 20% available on
// the image filesystem, which fires before a high threshold of 90.
var kubeletConfigs = map[string]string{
	"defaults.yaml": `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
`,
	"gc-off.yaml": `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
imageGCHighThresholdPercent: 100
imageMaximumGCAge: 0s
imageMinimumGCAge: 5m
`,
	"gc-on-eviction.yaml": `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
imageGCHighThresholdPercent: 90
imageGCLowThresholdPercent: 70
imageMinimumGCAge: 3m
evictionHard:
  imagefs.available: 20%
  memory.available: 100Mi
`,
}

// writeKubeletConfigs writes kubeletConfigs to a temp dir and returns it.
func writeKubeletConfigs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range kubeletConfigs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// policyOf maps a policy by setting name.
func policyOf(p []agent.Setting) map[string]agent.Setting {
	m := map[string]agent.Setting{}
	for _, s := range p {
		m[s.Name] = s
	}
	return m
}

// TestKubeletConfig: with --kubelet-config, a running agent (/status,
// /readyz, /metrics, its start log) and `gcagent plan --json` use the
// kubelet's image GC values with "kubelet-config PATH" as their source,
// say when the kubelet's own image GC is on or its eviction fires first,
// and let a flag still win.
func TestKubeletConfig(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testKubeletConfig(t, v) })
	}
}

func testKubeletConfig(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "64m"})
	c.Import(t, testenv.Pause(c.SandboxImage))
	kdir := writeKubeletConfigs(t)
	src := func(f string) string { return "kubelet-config " + filepath.Join(kdir, f) }

	type want struct {
		values, sources map[string]string
		gauge           string
		readyz          []string // lines /readyz must show
		quiet           bool     // no kubelet line in /readyz
	}
	for _, tc := range []struct {
		file string
		want want
	}{
		{"gc-on-eviction.yaml", want{
			values:  map[string]string{"image-gc-high-threshold": "90%", "image-gc-low-threshold": "70%", "minimum-image-ttl-duration": "3m0s", "image-maximum-gc-age": "0s"},
			sources: map[string]string{"image-gc-high-threshold": src("gc-on-eviction.yaml"), "image-gc-low-threshold": src("gc-on-eviction.yaml"), "minimum-image-ttl-duration": src("gc-on-eviction.yaml"), "kubelet-config": "flag"},
			gauge:   "gcagent_kubelet_image_gc_enabled 1",
			readyz:  []string{"kubelet: the kubelet's own image GC is on", "kubelet: evictionHard imagefs.available<20% in " + filepath.Join(kdir, "gc-on-eviction.yaml") + " fires no later than gcagent's --image-gc-high-threshold 90%"},
		}},
		{"gc-off.yaml", want{
			values:  map[string]string{"image-gc-high-threshold": "85%", "image-gc-low-threshold": "80%", "minimum-image-ttl-duration": "5m0s"},
			sources: map[string]string{"image-gc-high-threshold": "default", "image-gc-low-threshold": "default", "minimum-image-ttl-duration": src("gc-off.yaml")},
			gauge:   "gcagent_kubelet_image_gc_enabled 0",
			quiet:   true,
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(kdir, tc.file)
			a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--kubelet-config", path)
			var body string
			testenv.Eventually(t, 20*time.Second, func() string {
				code, b, err := a.GetText("/readyz")
				body = b
				if err != nil || code != 200 {
					return fmt.Sprintf("/readyz %d %v %q", code, err, b)
				}
				return ""
			})
			for _, line := range tc.want.readyz {
				if !strings.Contains(body, line) {
					t.Errorf("/readyz %q lacks %q", body, line)
				}
			}
			if tc.want.quiet && strings.Contains(body, "kubelet") {
				t.Errorf("/readyz %q: want no kubelet line with its image GC off", body)
			}
			var doc agent.StatusDoc
			if code, err := a.Get("/status", &doc); code != 200 || err != nil {
				t.Fatalf("/status %d %v", code, err)
			}
			pol := policyOf(doc.Policy)
			for name, val := range tc.want.values {
				if pol[name].Value != val {
					t.Errorf("/status policy %s = %q, want %q", name, pol[name].Value, val)
				}
			}
			for name, s := range tc.want.sources {
				if pol[name].Source != s {
					t.Errorf("/status policy %s from %q, want %q", name, pol[name].Source, s)
				}
			}
			_, metrics, err := a.GetText("/metrics")
			if err != nil || !strings.Contains(metrics, "\n"+tc.want.gauge+"\n") {
				t.Errorf("/metrics lacks %q (%v)", tc.want.gauge, err)
			}
			if promtool, err := exec.LookPath("promtool"); err == nil {
				cmd := exec.Command(promtool, "check", "metrics")
				cmd.Stdin = strings.NewReader(metrics)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("promtool check metrics: %v\n%s", err, out)
				}
			}
			// The start: the policy with sources, one warning for the
			// kubelet's image GC when on, and the preflight's lines.
			testenv.Eventually(t, 10*time.Second, func() string {
				log, _ := os.ReadFile(a.LogFile)
				if !strings.Contains(string(log), `"check":"clock"`) {
					return "no preflight line for the clock in the agent's log"
				}
				return ""
			})
			log, _ := os.ReadFile(a.LogFile)
			if n := strings.Count(string(log), "the kubelet's own image GC is on"); n != map[bool]int{true: 0, false: 1}[tc.want.quiet] {
				t.Errorf("%d log lines say the kubelet's image GC is on", n)
			}
			if !strings.Contains(string(log), `"image_gc_high_threshold":"`+tc.want.values["image-gc-high-threshold"]) {
				t.Errorf("start line lacks the high threshold %s", tc.want.values["image-gc-high-threshold"])
			}
			a.Stop()
		})
	}

	// plan without an agent: the kubelet's defaults file, and a flag that wins.
	plan := func(extra ...string) agent.Plan {
		t.Helper()
		args := append([]string{"plan", "--json", "--containerd-address", c.Address, "--namespace", testenv.Namespace,
			"--image-fs", c.Root, "--state-dir", filepath.Join(t.TempDir(), "state"), "--metrics-address", testenv.FreeAddr(t),
			"--log-dir", c.LogDir, "--pod-log-dir", c.PodLogDir}, extra...)
		out, err := exec.Command(testenv.AgentBinary(t), args...).Output()
		if err != nil {
			t.Fatalf("gcagent %v: %v", args, err)
		}
		var doc agent.Plan
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("plan: %v\n%s", err, out)
		}
		return doc
	}
	doc := plan("--kubelet-config", filepath.Join(kdir, "defaults.yaml"))
	pol := policyOf(doc.Policy)
	if s := pol["image-gc-high-threshold"]; s.Value != "85%" || s.Source != src("defaults.yaml") {
		t.Errorf("plan: high threshold %+v, want 85%% from %s", s, src("defaults.yaml"))
	}
	if s := pol["minimum-image-ttl-duration"]; s.Value != "2m0s" || s.Source != src("defaults.yaml") {
		t.Errorf("plan: minimum age %+v, want 2m0s from %s", s, src("defaults.yaml"))
	}
	if len(doc.KubeletNotes) != 1 || !strings.Contains(doc.KubeletNotes[0], "image GC is on") {
		t.Errorf("plan: kubelet notes %q, want one saying its image GC is on", doc.KubeletNotes)
	}
	doc = plan("--kubelet-config", filepath.Join(kdir, "gc-on-eviction.yaml"), "--image-gc-high-threshold=75")
	pol = policyOf(doc.Policy)
	if s := pol["image-gc-high-threshold"]; s.Value != "75%" || s.Source != "flag" {
		t.Errorf("plan: high threshold %+v, want 75%% from the flag", s)
	}
	if s := pol["image-gc-low-threshold"]; s.Value != "70%" || s.Source != src("gc-on-eviction.yaml") {
		t.Errorf("plan: low threshold %+v, want 70%% from the kubelet", s)
	}
	// At 75% gcagent starts before eviction at 20% available: no eviction note.
	if len(doc.KubeletNotes) != 1 {
		t.Errorf("plan: kubelet notes %q, want only the image GC one", doc.KubeletNotes)
	}
}
