package agent

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestWithSettings: a what-if changes the policy settings given, on a copy,
// and says which changed and what the agent's own values were; where the
// agent looks (namespaces, paths) may only be repeated.
func TestWithSettings(t *testing.T) {
	base := DefaultConfig()
	base.KeepImages = []string{"mine/*"}
	base.Sources = map[string]string{"keep-image": "flag"}
	for _, tc := range []struct {
		name    string
		set     url.Values
		changed []string
		check   func(Config) bool
		wantErr string
	}{
		{name: "nothing", set: nil, check: func(c Config) bool { return c.ImageGCHighThreshold == 85 }},
		{name: "lower threshold", set: url.Values{"image-gc-high-threshold": {"70%"}, "image-gc-low-threshold": {"60"}},
			changed: []string{"image-gc-high-threshold", "image-gc-low-threshold"},
			check: func(c Config) bool {
				return c.ImageGCHighThreshold == 70 && c.ImageGCLowThreshold == 60 &&
					c.Sources["image-gc-high-threshold"] == "what-if; the agent's: 85% (default)"
			}},
		{name: "high alone: the low follows it down", set: url.Values{"image-gc-high-threshold": {"70"}},
			changed: []string{"image-gc-high-threshold", "image-gc-low-threshold"},
			check: func(c Config) bool {
				return c.ImageGCHighThreshold == 70 && c.ImageGCLowThreshold == 65 &&
					c.Sources["image-gc-low-threshold"] == "what-if, moved with --image-gc-high-threshold: the agent's 80% (default) would exceed it"
			}},
		{name: "high alone above the low: the low stays", set: url.Values{"image-gc-high-threshold": {"90"}},
			changed: []string{"image-gc-high-threshold"},
			check:   func(c Config) bool { return c.ImageGCHighThreshold == 90 && c.ImageGCLowThreshold == 80 }},
		{name: "same values change nothing", set: url.Values{"image-gc-high-threshold": {"85"}, "namespace": {"k8s.io"}},
			check: func(c Config) bool { return c.Sources["image-gc-high-threshold"] == "" }},
		{name: "keep list replaced", set: url.Values{"keep-image": {"a/*", "b/*"}}, changed: []string{"keep-image"},
			check: func(c Config) bool {
				return slices.Equal(c.KeepImages, []string{"a/*", "b/*"}) && strings.Contains(c.Sources["keep-image"], "mine/* (flag)")
			}},
		{name: "another namespace", set: url.Values{"namespace": {"default"}}, wantErr: "--namespace default differs from the running agent's k8s.io"},
		{name: "another state dir", set: url.Values{"state-dir": {"/tmp/x"}}, wantErr: "--state-dir"},
		{name: "invalid policy", set: url.Values{"image-gc-low-threshold": {"90"}}, wantErr: "must not exceed --image-gc-high-threshold 85"},
		{name: "bad value", set: url.Values{"minimum-image-ttl-duration": {"5"}}, wantErr: "want a duration with a unit"},
		{name: "unknown", set: url.Values{"frob": {"1"}}, wantErr: `unknown setting "frob"`},
		{name: "two values", set: url.Values{"image-gc-high-threshold": {"70", "80"}}, wantErr: "takes one value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed, err := base.WithSettings(tc.set)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(changed, tc.changed) || !tc.check(got) {
				t.Errorf("changed %v (want %v), config %+v", changed, tc.changed, got)
			}
			if base.ImageGCHighThreshold != 85 || !slices.Equal(base.KeepImages, []string{"mine/*"}) || len(base.Sources) != 1 {
				t.Errorf("the agent's own config changed: %+v", base)
			}
		})
	}
}
