package events

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
)

// Labels and annotations CRI and the kubelet put on containers (copied:
// containerd's are internal).
const (
	labelCRIKind       = "io.cri-containerd.kind"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelContainerName = "io.kubernetes.container.name"

	annSandboxID        = "io.kubernetes.cri.sandbox-id"
	annSandboxUID       = "io.kubernetes.cri.sandbox-uid"
	annSandboxName      = "io.kubernetes.cri.sandbox-name"
	annSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	annContainerName    = "io.kubernetes.cri.container-name"
)

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

// imageEvent converts an image record; its content facts are supplied by
// the caller.
func imageEvent(at time.Time, img images.Image, f ImageFacts) ImageUpserted {
	return ImageUpserted{
		At:           at,
		Name:         img.Name,
		Digest:       img.Target.Digest.String(),
		Labels:       ImageLabels(img.Labels),
		Size:         f.Size,
		Created:      img.CreatedAt.UTC(),
		ConfigDigest: f.Config,
		ChainID:      f.Chain,
	}
}

// containerEventIn converts a container record of namespace ns: CRI labels
// mean a CRI container only in CRI's namespace; elsewhere anyone may have
// copied them, and the container is a plain one.
func containerEventIn(ns string, at time.Time, c containers.Container, known *ContainerFacts) ContainerUpserted {
	ev := containerEvent(at, c, known)
	if ns != CRINamespace {
		ev.CRIKind, ev.PodUID, ev.PodName, ev.PodNamespace, ev.ContainerName, ev.SandboxID = "", "", "", "", "", ""
	}
	return ev
}

// containerEvent converts a container record, all but its image's target
// digest (the caller resolves the name). Pod identity comes from the
// kubelet's labels, then from CRI's spec annotations, so CRI containers not
// made by a kubelet are still placed in their pod. known holds what the
// projection knows of this very container (nil if nothing): a container
// never changes sandbox, so when the labels name the rest, its spec
// (kilobytes of JSON) is not decoded.
func containerEvent(at time.Time, c containers.Container, known *ContainerFacts) ContainerUpserted {
	ev := ContainerUpserted{
		At:            at,
		ID:            c.ID,
		Image:         c.Image,
		CRIKind:       c.Labels[labelCRIKind],
		PodUID:        c.Labels[labelPodUID],
		PodName:       c.Labels[labelPodName],
		PodNamespace:  c.Labels[labelPodNamespace],
		ContainerName: c.Labels[labelContainerName],
		Created:       c.CreatedAt.UTC(),
	}
	if ev.CRIKind == "" {
		return ev
	}
	podNamed := ev.PodUID != "" && ev.PodName != "" && ev.PodNamespace != ""
	if ev.CRIKind == "sandbox" && podNamed {
		// The kubelet's labels say all a sandbox's annotations would: its
		// spec (kilobytes of JSON) is not decoded.
		ev.SandboxID = c.ID
		return ev
	}
	if ev.CRIKind == "container" && podNamed && ev.ContainerName != "" && known != nil && known.SandboxID != "" {
		ev.SandboxID = known.SandboxID
		return ev
	}
	ann := specAnnotations(c)
	fill := func(dst *string, key string) {
		if *dst == "" {
			*dst = ann[key]
		}
	}
	fill(&ev.PodUID, annSandboxUID)
	fill(&ev.PodName, annSandboxName)
	fill(&ev.PodNamespace, annSandboxNamespace)
	fill(&ev.SandboxID, annSandboxID)
	if ev.CRIKind == "container" {
		fill(&ev.ContainerName, annContainerName)
	}
	if ev.CRIKind == "sandbox" {
		ev.SandboxID = c.ID
	}
	return ev
}

// specAnnotations reads the OCI spec's annotations; containerd stores the
// spec as JSON, so no type registration is needed. Only the annotations
// are decoded (jsonField); annotations that do not decode yield none.
func specAnnotations(c containers.Container) map[string]string {
	if c.Spec == nil {
		return nil
	}
	doc := c.Spec.GetValue()
	if raw, ok := jsonField(doc, "annotations"); ok {
		var ann map[string]string
		if raw == nil || json.Unmarshal(raw, &ann) != nil {
			return nil
		}
		return ann
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil {
		return nil
	}
	return spec.Annotations
}
