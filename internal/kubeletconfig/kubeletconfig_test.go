package kubeletconfig

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	cases := []struct {
		file               string
		high, low          int
		minAge, maxAge     time.Duration
		gcOn               bool
		eviction           []string
		firstAt85, firstAt []string // EvictionFirst at high 85, and at the file's own high (capacity 10 GiB)
	}{
		{file: "defaults.yaml", high: 85, low: 80, minAge: 2 * time.Minute, gcOn: true,
			eviction: []string{"evictionHard imagefs.available<15%", "evictionHard nodefs.available<10%"}},
		{file: "gc-off.yaml", high: 100, low: 80, minAge: 5 * time.Minute, gcOn: false,
			eviction: []string{"evictionHard imagefs.available<15%", "evictionHard nodefs.available<10%"},
			firstAt:  []string{"evictionHard imagefs.available<15%", "evictionHard nodefs.available<10%"}},
		{file: "gc-on-eviction.yaml", high: 90, low: 70, minAge: 3 * time.Minute, maxAge: 168 * time.Hour, gcOn: true,
			// evictionHard is set without mergeDefaultEvictionSettings: the
			// kubelet's defaults do not apply (nodefs.available is soft only).
			eviction:  []string{"evictionHard imagefs.available<20%", "evictionSoft nodefs.available<1Gi"},
			firstAt85: []string{"evictionHard imagefs.available<20%"},
			firstAt:   []string{"evictionHard imagefs.available<20%"}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			s, err := Read("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if s.HighThreshold != tc.high || s.LowThreshold != tc.low || s.MinAge != tc.minAge || s.MaxAge != tc.maxAge || s.ImageGCOn() != tc.gcOn {
				t.Errorf("got high %d low %d min %s max %s on %v", s.HighThreshold, s.LowThreshold, s.MinAge, s.MaxAge, s.ImageGCOn())
			}
			var ev []string
			for _, e := range s.Eviction {
				ev = append(ev, e.String())
			}
			if !slices.Equal(ev, tc.eviction) {
				t.Errorf("eviction %q, want %q", ev, tc.eviction)
			}
			names := func(ts []Threshold) []string {
				var out []string
				for _, e := range ts {
					out = append(out, e.String())
				}
				return out
			}
			if got := names(s.EvictionFirst(85, 10<<30)); !slices.Equal(got, tc.firstAt85) {
				t.Errorf("EvictionFirst(85) %q, want %q", got, tc.firstAt85)
			}
			if got := names(s.EvictionFirst(s.HighThreshold, 10<<30)); !slices.Equal(got, tc.firstAt) {
				t.Errorf("EvictionFirst(%d) %q, want %q", s.HighThreshold, got, tc.firstAt)
			}
			notes := s.Notes(s.HighThreshold, 10<<30)
			if got := len(notes) > 0 && strings.Contains(notes[0], "image GC is on"); got != tc.gcOn {
				t.Errorf("notes %q: image GC note %v, want %v", notes, got, tc.gcOn)
			}
		})
	}
}

func TestReadRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"wrong kind":      {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", "want kubelet.config.k8s.io/v1beta1 KubeletConfiguration"},
		"no kind":         {"imageGCHighThresholdPercent: 100\n", "want kubelet.config.k8s.io/v1beta1 KubeletConfiguration"},
		"threshold > 100": {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 101\n", "must be between 0 and 100"},
		"bad eviction":    {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  imagefs.available: lots\n", "imagefs.available"},
		"empty":           {"\n", "empty"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("/etc/kubelet.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "/etc/kubelet.yaml") {
				t.Fatalf("err %v, want one naming the file and %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("err %q: want one line", err)
			}
		})
	}
	if s, err := Read("testdata/unknown-field.yaml"); err != nil || s.Lenient == "" {
		t.Errorf("testdata/unknown-field.yaml: lenient %v, err %v: want it read leniently", s, err)
	}
}

// TestEvictionFirst pins the comparison at its edges: gcagent starts at
// available below (101-high)% (the kubelet's rounding), so eviction at
// 15% is beaten by a high threshold of 85 and ties with 86.
func TestEvictionFirst(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		value    string
		high     int
		capacity uint64
		first    bool
	}{
		{"15%", 85, 0, false},
		{"15%", 86, 0, true},
		{"15.5%", 85, 0, false},
		{"16%", 85, 0, true},
		{"0%", 100, 0, false},   // no threshold
		{"100%", 100, 0, false}, // no threshold
		{"5%", 100, 0, true},    // no threshold GC: eviction always first
		{"1Gi", 85, 0, false},   // capacity unknown: not judged
		{"1Gi", 85, 10 * gib, false},
		{"2Gi", 85, 10 * gib, true},   // 20% of the disk
		{"1.6Gi", 85, 10 * gib, true}, // exactly 16%
	} {
		s, err := Parse("k.yaml", []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  imagefs.available: \""+tc.value+"\"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := len(s.EvictionFirst(tc.high, tc.capacity)) > 0; got != tc.first {
			t.Errorf("imagefs.available<%s, high %d, capacity %d: first %v, want %v", tc.value, tc.high, tc.capacity, got, tc.first)
		}
	}
}

// TestReadLenientLikeTheKubelet: what only strict decoding refuses (an
// unknown field, a newer kubelet's or a typo; a miscased or duplicate one)
// is decoded leniently, as the kubelet's codec does, with a note saying
// so: the fields the kubelet would ignore are ignored here too, the
// others taken.
func TestReadLenientLikeTheKubelet(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml, why string
		high      int
	}{
		"unknown field":   {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercnt: 100\nimageGCLowThresholdPercent: 60\n", `unknown field "imageGCHighThresholdPercnt"`, DefaultHighThreshold},
		"newer kubelet":   {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 60\nsomeFieldOf138: true\n", `unknown field "someFieldOf138"`, 90},
		"miscased field":  {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nImageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 60\n", "ImageGCHighThresholdPercent", DefaultHighThreshold},
		"duplicate field": {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 60\n", "imageGCHighThresholdPercent", 90},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := Parse("/etc/kubelet.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatalf("err %v, want a lenient decode", err)
			}
			if !strings.Contains(s.Lenient, tc.why) || s.HighThreshold != tc.high || s.LowThreshold != 60 {
				t.Errorf("lenient %q high %d low %d, want %q, %d, 60", s.Lenient, s.HighThreshold, s.LowThreshold, tc.why, tc.high)
			}
			if notes := s.Notes(85, 0); len(notes) == 0 || !strings.Contains(notes[0], "decoded leniently") {
				t.Errorf("notes %q: none says the file was decoded leniently", notes)
			}
		})
	}
	s, err := Parse("/etc/kubelet.yaml", []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\n"))
	if err != nil || s.Lenient != "" {
		t.Fatalf("a strict file: lenient %q, err %v", s.Lenient, err)
	}
}
