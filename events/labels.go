package events

import "strings"

// CRI's image labels gcagent reads: a pinned image is never deleted; a
// CRI-managed one is deleted through CRI.
const (
	LabelPinned     = "io.cri-containerd.pinned"
	LabelCRIManaged = "io.cri-containerd.image"
)

// ImageLabels returns the labels of l that gcagent reads (nil if none): an
// image record can carry any number, and a busy node has thousands. A set
// of the values CRI gives these labels is one map shared by every image
// that has it; any other set (a label is any client's to set, up to 4 KiB)
// is a map of its own, freed with what holds it, so no value a client
// writes is kept for the life of the process. Never modify the map.
func ImageLabels(l map[string]string) map[string]string {
	pinned, hasPinned := l[LabelPinned]
	managed, hasManaged := l[LabelCRIManaged]
	return ImageLabelsOf(pinned, hasPinned, managed, hasManaged)
}

// ImageLabelsOf is ImageLabels of labels whose LabelPinned is pinned (when
// hasPinned) and whose LabelCRIManaged is managed (when hasManaged), for a
// decoder that reads only those.
func ImageLabelsOf(pinned string, hasPinned bool, managed string, hasManaged bool) map[string]string {
	if !hasPinned && !hasManaged {
		return nil
	}
	if m := criLabelSets[labelKey{pinned, managed, hasPinned, hasManaged}]; m != nil {
		return m
	}
	m := make(map[string]string, 2)
	if hasPinned {
		m[LabelPinned] = strings.Clone(pinned) // not the record's: it may share a buffer
	}
	if hasManaged {
		m[LabelCRIManaged] = strings.Clone(managed)
	}
	return m
}

// criLabelSets are the sets of labels ImageLabels keeps as CRI writes them
// ("pinned", "managed"): images (a busy node's tens of thousands, in every
// listing and in the projection) share these few maps. Fixed: nothing
// learned at run time is added.
var criLabelSets = map[labelKey]map[string]string{
	{pinned: "pinned", hasPinned: true}:    {LabelPinned: "pinned"},
	{managed: "managed", hasManaged: true}: {LabelCRIManaged: "managed"},
	{"pinned", "managed", true, true}:      {LabelPinned: "pinned", LabelCRIManaged: "managed"},
}

type labelKey struct {
	pinned, managed       string
	hasPinned, hasManaged bool
}
