package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
)

// TestKubeletConfigDefaults: --kubelet-config takes the kubelet's image GC
// settings as defaults, with "kubelet-config PATH" as their source, while
// flags, environment and the config file still win; a kubelet whose image
// GC is handed over (high 100) gives no thresholds.
func TestKubeletConfigDefaults(t *testing.T) {
	td := "../../internal/kubeletconfig/testdata/"
	file := filepath.Join(t.TempDir(), "gcagent.conf")
	if err := os.WriteFile(file, []byte("minimum-image-ttl-duration = 10m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := func(f string) string { return "kubelet-config " + td + f }
	type want struct {
		high, low      int
		minAge, maxAge time.Duration
		sources        map[string]string
		notes          int // at gcagent's high threshold, capacity unknown
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want want
	}{
		{"defaults", []string{"--kubelet-config", td + "defaults.yaml"}, nil, want{85, 80, 2 * time.Minute, 0, map[string]string{
			"image-gc-high-threshold": src("defaults.yaml"), "image-gc-low-threshold": src("defaults.yaml"),
			"minimum-image-ttl-duration": src("defaults.yaml"), "image-maximum-gc-age": src("defaults.yaml"), "kubelet-config": "flag"}, 1}},
		{"gc off: thresholds not taken", nil, map[string]string{"GCAGENT_KUBELET_CONFIG": td + "gc-off.yaml"}, want{85, 80, 5 * time.Minute, 0, map[string]string{
			"image-gc-high-threshold": "default", "image-gc-low-threshold": "default",
			"minimum-image-ttl-duration": src("gc-off.yaml"), "kubelet-config": "env GCAGENT_KUBELET_CONFIG"}, 0}},
		{"gc on, eviction first", []string{"--kubelet-config", td + "gc-on-eviction.yaml"}, nil, want{90, 70, 3 * time.Minute, 168 * time.Hour, map[string]string{
			"image-gc-high-threshold": src("gc-on-eviction.yaml"), "image-maximum-gc-age": src("gc-on-eviction.yaml")}, 2}},
		{"flags, env and file win", []string{"--kubelet-config", td + "gc-on-eviction.yaml", "--image-gc-high-threshold=75", "--config", file},
			map[string]string{"GCAGENT_IMAGE_GC_LOW_THRESHOLD": "60"}, want{75, 60, 10 * time.Minute, 168 * time.Hour, map[string]string{
				"image-gc-high-threshold": "flag", "image-gc-low-threshold": "env GCAGENT_IMAGE_GC_LOW_THRESHOLD",
				"minimum-image-ttl-duration": "file " + file + ":1", "image-maximum-gc-age": src("gc-on-eviction.yaml")}, 1}}, // 20% eviction after 75%
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseRun(tc.args, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ImageGCHighThreshold != tc.want.high || cfg.ImageGCLowThreshold != tc.want.low ||
				cfg.MinimumImageTTL != tc.want.minAge || cfg.ImageMaximumGCAge != tc.want.maxAge {
				t.Errorf("high %d low %d min %s max %s, want %+v", cfg.ImageGCHighThreshold, cfg.ImageGCLowThreshold,
					cfg.MinimumImageTTL, cfg.ImageMaximumGCAge, tc.want)
			}
			policy := map[string]agent.Setting{}
			for _, s := range cfg.Policy() {
				policy[s.Name] = s
			}
			for name, source := range tc.want.sources {
				if got := policy[name].Source; got != source {
					t.Errorf("%s: source %q, want %q", name, got, source)
				}
			}
			if notes := cfg.Kubelet.Notes(cfg.ImageGCHighThreshold, 0); len(notes) != tc.want.notes {
				t.Errorf("notes %q, want %d", notes, tc.want.notes)
			}
		})
	}
	for name, path := range map[string]string{"missing": "/nonexistent/config.yaml", "unknown field": td + "unknown-field.yaml"} {
		t.Run(name, func(t *testing.T) {
			_, err := parseRun([]string{"--kubelet-config", path}, nil)
			if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "invalid --kubelet-config "+path) {
				t.Fatalf("err %v, want a usage error naming --kubelet-config and the file", err)
			}
			t.Log(err)
		})
	}
}
