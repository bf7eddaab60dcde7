// Package kubeletconfig reads a node's KubeletConfiguration file with the
// kubelet's own types, applies the kubelet's defaults to the fields gcagent
// cares about (image GC and eviction), and judges them against gcagent's
// policy: whether the kubelet's image GC still runs, and whether its
// eviction thresholds fire before gcagent's high threshold.
package kubeletconfig

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// DefaultPath is where kubeadm and most distributions put the kubelet's
// config file.
const DefaultPath = "/var/lib/kubelet/config.yaml"

// The kubelet's defaults for the fields gcagent takes (v1beta1
// defaults.go, kubernetes v1.37): used when a field is absent.
const (
	DefaultHighThreshold = 85
	DefaultLowThreshold  = 80
	DefaultMinAge        = 2 * time.Minute
	DefaultMaxAge        = 0
	DefaultSyncFrequency = time.Minute
)

// DefaultEvictionHard is the kubelet's hard eviction thresholds on Linux
// (pkg/kubelet/eviction/defaults_linux.go) for the disk signals gcagent
// checks; the kubelet uses its whole default map when evictionHard is
// absent, and merges it only with mergeDefaultEvictionSettings.
var DefaultEvictionHard = map[string]string{
	"nodefs.available":  "10%",
	"imagefs.available": "15%",
	// The kubelet's other defaults (memory, inodes) do not concern image GC.
	"memory.available":   "100Mi",
	"nodefs.inodesFree":  "5%",
	"imagefs.inodesFree": "5%",
}

// Settings is what gcagent takes from a KubeletConfiguration, the kubelet's
// defaults applied.
type Settings struct {
	// Path is the file read.
	Path string
	// HighThreshold and LowThreshold are imageGCHighThresholdPercent and
	// imageGCLowThresholdPercent.
	HighThreshold, LowThreshold int
	// MinAge and MaxAge are imageMinimumGCAge and imageMaximumGCAge.
	MinAge, MaxAge time.Duration
	// Set names the image GC fields the file gave (by their kubelet names);
	// the others are the kubelet's defaults.
	Set []string
	// Eviction are the disk eviction thresholds in force (hard and soft,
	// imagefs.available and nodefs.available).
	Eviction []Threshold
	// SyncFrequency is syncFrequency: how often the kubelet syncs each
	// pod, and so how long its pod status may lag the runtime.
	SyncFrequency time.Duration
	// Lenient says what strict decoding refused (an unknown, duplicate or
	// miscased field: a newer kubelet's, or a typo) when the file was then
	// decoded leniently, as the kubelet itself decodes it; empty when
	// strict decoding took it.
	Lenient string
}

// Threshold is one eviction threshold on available disk space.
type Threshold struct {
	// Kind is "hard" or "soft"; Signal imagefs.available or nodefs.available.
	Kind, Signal string
	// Value is as written ("15%", "2Gi").
	Value string
	// Percent is set for a percentage, Bytes for a quantity.
	Percent float64
	Bytes   int64
}

// String is e.g. "evictionHard imagefs.available<15%".
func (t Threshold) String() string {
	return fmt.Sprintf("eviction%s %s<%s", strings.ToUpper(t.Kind[:1])+t.Kind[1:], t.Signal, t.Value)
}

// ImageGCOn reports whether the kubelet's periodic image GC runs: it stops
// only with imageGCHighThresholdPercent 100 and imageMaximumGCAge 0
// (kubelet.go StartGarbageCollection).
func (s *Settings) ImageGCOn() bool {
	return s.HighThreshold < 100 || s.MaxAge > 0
}

// Read decodes path as a kubelet.config.k8s.io/v1beta1
// KubeletConfiguration and applies the kubelet's defaults. Like the kubelet
// (its codec's DecodeKubeletConfiguration), it tries strict decoding first
// and, when only that fails (an unknown, duplicate or miscased field),
// decodes leniently and says so in Lenient: a config written for a newer
// kubelet must not stop the agent the kubelet itself runs with, and what
// the agent takes is what the kubelet takes. A file that is not YAML, of
// another kind or with a bad value is an error. Errors name no flag; the
// caller adds it.
func Read(path string) (*Settings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse is Read of the contents b of the file path.
func Parse(path string, b []byte) (*Settings, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	var why []string // what only strict decoding refuses
	js, serr := yaml.YAMLToJSONStrict(b)
	if serr != nil {
		// A duplicate key: the lenient YAML decoder takes the last value.
		var err error
		if js, err = yaml.YAMLToJSON(b); err != nil {
			return nil, fmt.Errorf("%s: %s", path, oneLine(err))
		}
		why = append(why, oneLine(serr))
	}
	var kc kubeletv1beta1.KubeletConfiguration
	strict, err := kjson.UnmarshalStrict(js, &kc)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	for _, e := range strict {
		why = append(why, e.Error())
	}
	lenient := strings.Join(why, "; ")
	want := kubeletv1beta1.SchemeGroupVersion.String()
	if kc.APIVersion != want || kc.Kind != "KubeletConfiguration" {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q: want %s KubeletConfiguration", path, kc.APIVersion, kc.Kind, want)
	}
	s := &Settings{Path: path, HighThreshold: DefaultHighThreshold, LowThreshold: DefaultLowThreshold,
		MinAge: DefaultMinAge, MaxAge: DefaultMaxAge, SyncFrequency: DefaultSyncFrequency, Lenient: lenient}
	if kc.SyncFrequency.Duration > 0 {
		s.SyncFrequency = kc.SyncFrequency.Duration
	}
	if kc.ImageGCHighThresholdPercent != nil {
		s.HighThreshold = int(*kc.ImageGCHighThresholdPercent)
		s.Set = append(s.Set, "imageGCHighThresholdPercent")
	}
	if kc.ImageGCLowThresholdPercent != nil {
		s.LowThreshold = int(*kc.ImageGCLowThresholdPercent)
		s.Set = append(s.Set, "imageGCLowThresholdPercent")
	}
	// The kubelet turns an absent or zero imageMinimumGCAge into 2m.
	if kc.ImageMinimumGCAge.Duration != 0 {
		s.MinAge = kc.ImageMinimumGCAge.Duration
		s.Set = append(s.Set, "imageMinimumGCAge")
	}
	if kc.ImageMaximumGCAge.Duration != 0 {
		s.MaxAge = kc.ImageMaximumGCAge.Duration
		s.Set = append(s.Set, "imageMaximumGCAge")
	}
	for name, v := range map[string]int{"imageGCHighThresholdPercent": s.HighThreshold, "imageGCLowThresholdPercent": s.LowThreshold} {
		if v < 0 || v > 100 {
			return nil, fmt.Errorf("%s: %s %d: must be between 0 and 100", path, name, v)
		}
	}
	if s.MinAge < 0 || s.MaxAge < 0 {
		return nil, fmt.Errorf("%s: imageMinimumGCAge %s, imageMaximumGCAge %s: must not be negative", path, s.MinAge, s.MaxAge)
	}
	hard := kc.EvictionHard
	if hard == nil {
		hard = DefaultEvictionHard
	} else if kc.MergeDefaultEvictionSettings != nil && *kc.MergeDefaultEvictionSettings {
		hard = maps.Clone(hard)
		for k, v := range DefaultEvictionHard {
			if _, ok := hard[k]; !ok {
				hard[k] = v
			}
		}
	}
	for _, set := range []struct {
		kind string
		m    map[string]string
	}{{"hard", hard}, {"soft", kc.EvictionSoft}} {
		for _, sig := range slices.Sorted(maps.Keys(set.m)) {
			if sig != "imagefs.available" && sig != "nodefs.available" {
				continue
			}
			t, ok, err := parseThreshold(set.kind, sig, set.m[sig])
			if err != nil {
				return nil, fmt.Errorf("%s: eviction%s %s: %v", path, strings.ToUpper(set.kind[:1])+set.kind[1:], sig, err)
			}
			if ok {
				s.Eviction = append(s.Eviction, t)
			}
		}
	}
	return s, nil
}

// oneLine joins a multi-line error (the YAML decoder's) into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), ":\n", ":")), " ")
}

// parseThreshold reads an eviction value as the kubelet does
// (eviction/helpers.go parseThresholdStatement): 0% and 100% are no
// threshold; a quantity must be positive.
func parseThreshold(kind, signal, v string) (Threshold, bool, error) {
	t := Threshold{Kind: kind, Signal: signal, Value: v}
	if p, ok := strings.CutSuffix(v, "%"); ok {
		if v == "0%" || v == "100%" {
			return t, false, nil
		}
		f, err := strconv.ParseFloat(p, 32)
		if err != nil || f < 0 || f > 100 || math.IsNaN(f) {
			return t, false, fmt.Errorf("%q: want a percentage from 0%% to 100%%", v)
		}
		t.Percent = f
		return t, true, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return t, false, fmt.Errorf("%q: %v", v, err)
	}
	if q.Sign() <= 0 {
		return t, false, fmt.Errorf("%q: must be positive", v)
	}
	t.Bytes = q.Value()
	return t, true, nil
}

// EvictionFirst returns the eviction thresholds that fire no later than
// gcagent's image GC does, as the disk fills: gcagent starts at a usage of
// high percent, rounded up as the kubelet rounds it (100 -
// floor(available*100/capacity) >= high, i.e. available below (101-high)%),
// and eviction when available falls below its threshold. A quantity is
// judged against capacity (bytes); with capacity 0 (unknown) it is skipped.
// nodefs thresholds are judged as if the node filesystem were the image
// filesystem, the usual single-disk node. A high threshold of 100 (no
// threshold GC) is always beaten by any threshold.
func (s *Settings) EvictionFirst(high int, capacity uint64) []Threshold {
	var out []Threshold
	for _, t := range s.Eviction {
		// gcagent's trigger: available*100 < (101-high)*capacity.
		switch {
		case t.Bytes == 0 && t.Percent >= float64(101-high):
			out = append(out, t)
		case t.Bytes > 0 && capacity > 0 && float64(t.Bytes)*100 >= float64(101-high)*float64(capacity):
			out = append(out, t)
		}
	}
	return out
}

// Notes are the warnings an operator needs about this kubelet config next
// to gcagent's high threshold and the image filesystem's capacity (0 when
// unknown): the kubelet's image GC still on, and eviction thresholds that
// fire first, and a file decoded leniently. Empty when all is well.
func (s *Settings) Notes(high int, capacity uint64) []string {
	var out []string
	if s.Lenient != "" {
		out = append(out, fmt.Sprintf("%s decoded leniently, as the kubelet decodes it (%s): fields this agent does not know are ignored, by the kubelet too if it does not know them", s.Path, s.Lenient))
	}
	if s.ImageGCOn() {
		out = append(out, s.ImageGCNote())
	}
	for _, t := range s.EvictionFirst(high, capacity) {
		out = append(out, fmt.Sprintf("%s in %s fires no later than gcagent's --image-gc-high-threshold %d%%: the kubelet evicts pods before gcagent frees images; lower the high threshold or the eviction threshold", t, s.Path, high))
	}
	return out
}

// ImageGCNote says that the kubelet's image GC is on, and how to hand it over.
func (s *Settings) ImageGCNote() string {
	return fmt.Sprintf("the kubelet's own image GC is on (%s: imageGCHighThresholdPercent %d, imageMaximumGCAge %s): two collectors decide over one disk; set imageGCHighThresholdPercent: 100 and imageMaximumGCAge: 0s and restart the kubelet",
		s.Path, s.HighThreshold, s.MaxAge)
}
