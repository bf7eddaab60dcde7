package events

import "sync"

// CRI's image labels gcagent reads: a pinned image is never deleted; a
// CRI-managed one is deleted through CRI.
const (
	LabelPinned     = "io.cri-containerd.pinned"
	LabelCRIManaged = "io.cri-containerd.image"
)

// ImageLabels returns the labels of l that gcagent reads (nil if none): an
// image record can carry any number, and a busy node has thousands. The
// map is shared by every image with the same set: never modify it.
func ImageLabels(l map[string]string) map[string]string {
	pinned, hasPinned := l[LabelPinned]
	managed, hasManaged := l[LabelCRIManaged]
	if !hasPinned && !hasManaged {
		return nil
	}
	key := labelKey{pinned, managed, hasPinned, hasManaged}
	if m, ok := labelSets.Load(key); ok {
		return m.(map[string]string)
	}
	m := map[string]string{}
	if hasPinned {
		m[LabelPinned] = pinned
	}
	if hasManaged {
		m[LabelCRIManaged] = managed
	}
	shared, _ := labelSets.LoadOrStore(key, m)
	return shared.(map[string]string)
}

// labelSets holds one map per distinct set of the labels ImageLabels
// keeps: images (a busy node's tens of thousands, in every listing and in
// the projection) share a handful of them.
var labelSets sync.Map // labelKey -> map[string]string

type labelKey struct {
	pinned, managed       string
	hasPinned, hasManaged bool
}
