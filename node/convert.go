package node

import (
	"encoding/json"

	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/gcagent/gcagent/events"
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
	annSandboxLogDir    = "io.kubernetes.cri.sandbox-log-directory"
)

// imageEvent converts an image record; its content facts are supplied by
// the caller.
func imageEvent(at time.Time, img images.Image, f ImageFacts) events.ImageUpserted {
	return events.ImageUpserted{
		At:           at,
		Name:         img.Name,
		Digest:       img.Target.Digest.String(),
		Labels:       events.ImageLabels(img.Labels),
		Size:         f.Size,
		Created:      img.CreatedAt.UTC(),
		ConfigDigest: f.Config,
		ChainID:      f.Chain,
	}
}

// containerEventIn converts a container record of namespace ns: CRI labels
// mean a CRI container only in CRI's namespace; elsewhere anyone may have
// copied them, and the container is a plain one.
func containerEventIn(ns string, at time.Time, c containers.Container, known *ContainerFacts) events.ContainerUpserted {
	ev := containerEvent(at, c, known)
	if ns != events.CRINamespace {
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
func containerEvent(at time.Time, c containers.Container, known *ContainerFacts) events.ContainerUpserted {
	ev := events.ContainerUpserted{
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
		// A sandbox's spec is decoded whatever its labels say (one per
		// pod): only its annotations tell where CRI writes the pod's
		// logs, the evidence that the pod log dir is this CRI's.
		ev.SandboxID, ev.LogDir = c.ID, ann[annSandboxLogDir]
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
