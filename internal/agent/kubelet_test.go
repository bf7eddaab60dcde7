package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

func writeKubelet(t *testing.T, path string, high, low int) {
	t.Helper()
	b := fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+
		"imageGCHighThresholdPercent: %d\nimageGCLowThresholdPercent: %d\n", high, low)
	// A new file renamed over the old one: a new inode, as editors,
	// kubeadm and configuration management write.
	tmp := filepath.Join(filepath.Dir(path), ".config.yaml.swp")
	if err := os.WriteFile(tmp, []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// kubeletAgent is an agent with only what reportKubelet needs, its log in
// a buffer.
func kubeletAgent(t *testing.T, cfg Config) (*agent, *prometheus.Registry, *bytes.Buffer) {
	t.Helper()
	if err := cfg.AdoptKubelet(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	a := &agent{cfg: cfg, log: zerolog.New(&buf), reg: reg}
	a.reportKubelet()
	return a, reg, &buf
}

// lastLine returns the last log line and empties buf.
func lastLine(buf *bytes.Buffer) string {
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	buf.Reset()
	return lines[len(lines)-1]
}

func gauge(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, "gcagent_kubelet_image_gc_enabled")
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return "none"
	}
	mfs, _ := reg.Gather()
	return fmt.Sprint(mfs[0].GetMetric()[0].GetGauge().GetValue())
}

// TestKubeletFollowsRewrites: in a real directory, the kubelet's config at
// 70/20 gives the agent 70/20; rewritten (renamed over) to 100, the
// follower says the kubelet's image GC is handed over (notes, gauge) while
// the policy stays 70/20 until the next start, which the one log line
// names; removed, the last read stands; a flag keeps winning.
func TestKubeletFollowsRewrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeKubelet(t, path, 70, 20)
	cfg := DefaultConfig()
	cfg.KubeletConfig = path
	a, reg, buf := kubeletAgent(t, cfg)
	if a.cfg.ImageGCHighThreshold != 70 || a.cfg.ImageGCLowThreshold != 20 {
		t.Fatalf("policy %d/%d, want the kubelet's 70/20", a.cfg.ImageGCHighThreshold, a.cfg.ImageGCLowThreshold)
	}
	log := buf.String()
	buf.Reset()
	for _, want := range []string{`"taken":["image-gc-high-threshold=70%","image-gc-low-threshold=20%"`, `"the kubelet's own image GC is on`} {
		if !strings.Contains(log, want) {
			t.Errorf("start log lacks %s:\n%s", want, log)
		}
	}
	if g := gauge(t, reg); g != "1" {
		t.Errorf("gauge %s, want 1", g)
	}
	if n := a.kubeletNotes(); len(n) != 1 || !strings.Contains(n[0], "image GC is on") {
		t.Errorf("notes %q, want the image GC one", n)
	}

	writeKubelet(t, path, 100, 20)
	a.kubelet.poll()
	if g := gauge(t, reg); g != "0" {
		t.Errorf("after the handover: gauge %s, want 0", g)
	}
	if n := a.kubeletNotes(); len(n) != 0 {
		t.Errorf("after the handover: notes %q, want none", n)
	}
	line := lastLine(buf)
	for _, want := range []string{"the kubelet's image GC is handed over", "stays until its next start, which takes image-gc-high-threshold 85% (now 70%), image-gc-low-threshold 80% (now 20%)", `"kubelet_image_gc":false`} {
		if !strings.Contains(line, want) {
			t.Errorf("handover line lacks %q: %s", want, line)
		}
	}
	if p := settingsByName(a.policySettings()); p["image-gc-high-threshold"].Value != "70%" {
		t.Errorf("policy in force %v: want 70%% until the next start", p["image-gc-high-threshold"])
	}
	a.kubelet.poll()
	if buf.Len() != 0 {
		t.Errorf("a poll without a change logged: %s", buf)
	}

	writeKubelet(t, path, 60, 50)
	a.kubelet.poll()
	if line := lastLine(buf); !strings.Contains(line, "own image GC is on") || !strings.Contains(line, "image-gc-high-threshold 60% (now 70%), image-gc-low-threshold 50% (now 20%)") {
		t.Errorf("line after 60/50: %s", line)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	a.kubelet.poll()
	if line := lastLine(buf); !strings.Contains(line, "absent since it was last read: the last read stands") {
		t.Errorf("line after the removal: %s", line)
	}
	if n := a.kubeletNotes(); len(n) != 2 || !strings.Contains(n[0], "absent") || !strings.Contains(n[1], "imageGCHighThresholdPercent 60") {
		t.Errorf("notes after the removal %q: want the absence, then the last read", n)
	}
	if g := gauge(t, reg); g != "1" {
		t.Errorf("after the removal: gauge %s, want the last read's 1", g)
	}

	// A flag wins, then and at the next start.
	writeKubelet(t, path, 70, 20)
	cfg = DefaultConfig()
	cfg.KubeletConfig = path
	cfg.ImageGCHighThreshold, cfg.Sources = 75, map[string]string{"image-gc-high-threshold": "flag"}
	a, _, buf = kubeletAgent(t, cfg)
	if !strings.Contains(buf.String(), `"not_taken":["image-gc-high-threshold=75% (flag)"]`) {
		t.Errorf("start line lacks what was not taken: %s", buf)
	}
	buf.Reset()
	writeKubelet(t, path, 60, 50)
	a.kubelet.poll()
	if line := lastLine(buf); !strings.Contains(line, `which takes image-gc-low-threshold 50% (now 20%) (set them`) {
		t.Errorf("line with a flag: %s", line)
	}
}

// TestKubeletAbsentAtStart: an absent file is no error; nothing is taken,
// /readyz says so and the gauge has no sample until the file comes.
func TestKubeletAbsentAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	cfg := DefaultConfig()
	cfg.KubeletConfig = path
	a, reg, buf := kubeletAgent(t, cfg)
	if a.cfg.Kubelet != nil || a.cfg.ImageGCHighThreshold != 85 {
		t.Fatalf("kubelet %v, high %d: want nothing taken", a.cfg.Kubelet, a.cfg.ImageGCHighThreshold)
	}
	if buf.Len() != 0 {
		t.Errorf("logged at start (the preflight's check line says it): %s", buf)
	}
	if g := gauge(t, reg); g != "none" {
		t.Errorf("gauge %s, want no sample", g)
	}
	if n := a.kubeletNotes(); len(n) != 1 || !strings.Contains(n[0], path+" absent: nothing is known") {
		t.Errorf("notes %q", n)
	}
	buf.Reset()
	a.kubelet.poll()
	if buf.Len() != 0 {
		t.Errorf("still absent, logged again: %s", buf)
	}
	writeKubelet(t, path, 70, 20)
	a.kubelet.poll()
	if line := lastLine(buf); !strings.Contains(line, "which takes image-gc-high-threshold 70% (now 85%), image-gc-low-threshold 20% (now 80%)") {
		t.Errorf("line when the file came: %s", line)
	}
	if g := gauge(t, reg); g != "1" {
		t.Errorf("gauge %s, want 1", g)
	}
	if n := a.kubeletNotes(); len(n) != 1 || strings.Contains(n[0], "absent") {
		t.Errorf("notes %q: want only the image GC one", n)
	}
}

// TestCheckKubeletAbsent: `check` WARNs (exit status 0) for an absent
// --kubelet-config and FAILs for an invalid one.
func TestCheckKubeletAbsent(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KubeletConfig = filepath.Join(t.TempDir(), "config.yaml")
	if r := checkKubelet(cfg, 0); len(r) != 1 || r[0].Status != CheckWarn || !strings.Contains(r[0].Detail, "absent: nothing taken") {
		t.Errorf("absent: %+v", r)
	}
	if err := os.WriteFile(cfg.KubeletConfig, []byte("kind: KubeletConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := checkKubelet(cfg, 0); len(r) != 1 || r[0].Status != CheckFail {
		t.Errorf("invalid: %+v", r)
	}
}
