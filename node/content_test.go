package node

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestFactsFromLabels: an image's facts come from labels only when they
// name exactly what the kubelet's size walk adds up; anything else is read.
func TestFactsFromLabels(t *testing.T) {
	d := func(s string) string { return digest.FromString(s).String() }
	manifest, cfg, l0, l1, chain := d("m"), d("c"), d("l0"), d("l1"), d("chain")
	img := images.Image{Name: "a:1", Target: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.Digest(manifest), Size: 100}}
	// The index is described with maps, which the cases change, then
	// built.
	type blob struct {
		size   int64
		labels map[string]string
	}
	type desc struct {
		blobs        map[string]blob
		snapshotters []string
	}
	index := func(mutate func(ix *desc)) *contentIndex {
		ix := &desc{snapshotters: []string{"overlayfs"}, blobs: map[string]blob{
			manifest: {100, map[string]string{labelConfigRef: cfg, labelLayerRef + "0": l0, labelLayerRef + "1": l1}},
			cfg:      {10, map[string]string{labelSnapshotRef + "overlayfs": chain}},
			l0:       {1000, nil},
			l1:       {2000, nil},
		}}
		if mutate != nil {
			mutate(ix)
		}
		out := &contentIndex{snapshotters: ix.snapshotters, blobs: map[string]blobInfo{}}
		for d, b := range ix.blobs {
			var l gcLabels
			for k, v := range b.labels {
				l = l.set(k, v)
			}
			out.blobs[d] = blobInfo{b.size, l}
		}
		return out
	}
	f, ok := index(nil).facts(img)
	if want := (ImageFacts{Size: 3110, Config: cfg, Chain: chain}); !ok || f != want {
		t.Fatalf("facts %+v %v, want %+v", f, ok, want)
	}
	for name, mutate := range map[string]func(ix *desc){
		"a layer missing":           func(ix *desc) { delete(ix.blobs, l1) },
		"layers not from l.0":       func(ix *desc) { delete(ix.blobs[manifest].labels, labelLayerRef+"0") },
		"layers discarded":          func(ix *desc) { ix.blobs[manifest] = blob{100, map[string]string{labelConfigRef: cfg}} },
		"another child":             func(ix *desc) { ix.blobs[manifest].labels[labelContentRef+"0"] = d("x") },
		"not unpacked":              func(ix *desc) { ix.blobs[cfg] = blob{10, nil} },
		"unpacked for another":      func(ix *desc) { ix.snapshotters = []string{"native"} },
		"config missing":            func(ix *desc) { delete(ix.blobs, cfg) },
		"manifest not listed":       func(ix *desc) { delete(ix.blobs, manifest) },
		"chain label not a digest":  func(ix *desc) { ix.blobs[cfg].labels[labelSnapshotRef+"overlayfs"] = "x" },
		"config label not a digest": func(ix *desc) { ix.blobs[manifest].labels[labelConfigRef] = "x" },
	} {
		if f, ok := index(mutate).facts(img); ok {
			t.Errorf("%s: facts %+v from labels, want a read", name, f)
		}
	}
	// Not unpacked (for a snapshotter in use): the labels still give the
	// size and the config, and only the config is read for the chain.
	for name, mutate := range map[string]func(ix *desc){
		"not unpacked":             func(ix *desc) { ix.blobs[cfg] = blob{10, nil} },
		"unpacked for another":     func(ix *desc) { ix.snapshotters = []string{"native"} },
		"chain label not a digest": func(ix *desc) { ix.blobs[cfg].labels[labelSnapshotRef+"overlayfs"] = "x" },
	} {
		if f, _ := index(mutate).facts(img); f != (ImageFacts{Size: 3110, Config: cfg}) {
			t.Errorf("%s: facts %+v, want the size and config without the chain", name, f)
		}
	}
	idx := img
	idx.Target.MediaType = ocispec.MediaTypeImageIndex
	if _, ok := index(nil).facts(idx); ok {
		t.Error("an index: facts from labels, want a read (the platform's manifest is chosen by reading it)")
	}
	if _, ok := (*contentIndex)(nil).facts(img); ok {
		t.Error("no content listing: facts from labels")
	}
}

// TestContainerEventSpec: a CRI record's pod identity comes from the
// kubelet's labels, else from CRI's spec annotations; a sandbox's pod log
// directory comes from its spec whatever its labels say (a spec that does
// not decode gives none, and the labels still name the pod).
func TestContainerEventSpec(t *testing.T) {
	labels := map[string]string{labelCRIKind: "sandbox", labelPodUID: "uid", labelPodName: "pod", labelPodNamespace: "ns"}
	spec, err := typeurl.MarshalAny(&specs.Spec{Annotations: map[string]string{
		annSandboxUID: "uid2", annSandboxName: "pod2", annSandboxNamespace: "ns2", annSandboxID: "sb2", annContainerName: "app",
		annSandboxLogDir: "/var/log/pods/ns2_pod2_uid2"}})
	if err != nil {
		t.Fatal(err)
	}
	broken := &anypb.Any{TypeUrl: spec.GetTypeUrl(), Value: []byte("{not json")}

	sb := containerEvent(time.Time{}, containers.Container{ID: "sb1", Labels: labels, Spec: broken}, nil)
	if sb.PodUID != "uid" || sb.PodName != "pod" || sb.PodNamespace != "ns" || sb.SandboxID != "sb1" || sb.LogDir != "" {
		t.Errorf("labelled sandbox, spec broken: %+v", sb)
	}
	sb = containerEvent(time.Time{}, containers.Container{ID: "sb1", Labels: labels, Spec: spec}, nil)
	if sb.PodUID != "uid" || sb.PodName != "pod" || sb.SandboxID != "sb1" || sb.LogDir != "/var/log/pods/ns2_pod2_uid2" {
		t.Errorf("labelled sandbox: %+v, want the labels' pod and the spec's log dir", sb)
	}
	bare := containerEvent(time.Time{}, containers.Container{ID: "sb1", Labels: map[string]string{labelCRIKind: "sandbox"},
		Spec: &anypb.Any{TypeUrl: spec.GetTypeUrl(), Value: spec.GetValue()}}, nil)
	if bare.PodUID != "uid2" || bare.PodName != "pod2" || bare.PodNamespace != "ns2" || bare.SandboxID != "sb1" || bare.LogDir != "/var/log/pods/ns2_pod2_uid2" {
		t.Errorf("sandbox without the kubelet's labels: %+v", bare)
	}
	ctr := containerEvent(time.Time{}, containers.Container{ID: "c1", Labels: map[string]string{labelCRIKind: "container", labelPodUID: "uid"},
		Spec: &anypb.Any{TypeUrl: spec.GetTypeUrl(), Value: spec.GetValue()}}, nil)
	if ctr.PodUID != "uid" || ctr.PodName != "pod2" || ctr.SandboxID != "sb2" || ctr.ContainerName != "app" || ctr.LogDir != "" {
		t.Errorf("container: %+v", ctr)
	}

	// A container the projection knows, fully labelled: its known sandbox,
	// and the spec is not decoded (it is broken here).
	full := map[string]string{labelCRIKind: "container", labelPodUID: "uid", labelPodName: "pod", labelPodNamespace: "ns", labelContainerName: "app"}
	known := containerEvent(time.Time{}, containers.Container{ID: "c1", Labels: full, Spec: broken}, &ContainerFacts{SandboxID: "sb-known"})
	if known.SandboxID != "sb-known" || known.PodUID != "uid" || known.ContainerName != "app" {
		t.Errorf("known container: %+v", known)
	}
	// Unknown, fully labelled: the sandbox comes from the spec.
	if got := containerEvent(time.Time{}, containers.Container{ID: "c1", Labels: full, Spec: spec}, nil); got.SandboxID != "sb2" || got.PodName != "pod" {
		t.Errorf("unknown labelled container: %+v", got)
	}
	// Known, but a label is missing: the spec fills it (and the sandbox).
	partial := maps.Clone(full)
	delete(partial, labelContainerName)
	if got := containerEvent(time.Time{}, containers.Container{ID: "c1", Labels: partial, Spec: spec}, &ContainerFacts{SandboxID: "sb-known"}); got.SandboxID != "sb2" || got.ContainerName != "app" {
		t.Errorf("known container missing a label: %+v", got)
	}
}

// TestSlimKnown: a listing holds what it read of a record (listedContainer
// has no place for its spec, CRI metadata or labels); a CRI container the projection knows takes its facts from it
// (after a start), one it does not know from its spec and metadata, and
// so does every one in a periodic listing.
func TestSlimKnown(t *testing.T) {
	hex := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	meta := []byte(`{"Metadata":{"ImageRef":"` + hex("a") + `","Config":{"mounts":[{"image":{"image":"vol:1"}}]}}}`)
	spec, err := typeurl.MarshalAny(&specs.Spec{Annotations: map[string]string{annSandboxID: "sb-spec"}})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{labelCRIKind: "container", labelPodUID: "uid", labelPodName: "pod", labelPodNamespace: "ns", labelContainerName: "app"}
	c := containers.Container{ID: "c1", Labels: labels, Spec: spec, Extensions: map[string]typeurl.Any{extCRIContainerMetadata: &anypb.Any{Value: meta}}}
	known := ContainerFacts{SandboxID: "sb-known", ImageID: hex("b"), VolumeImageIDs: []string{hex("d")}}
	s := NewSource(Options{KnownContainer: func(ns, id string, _ time.Time) (ContainerFacts, bool) {
		return known, ns == events.CRINamespace && id == "c1"
	}})
	at := time.Unix(1000, 0)
	type slimmed struct {
		ev events.ContainerUpserted
		listedContainer
	}
	listed := func(c containers.Container, useKnown bool) slimmed {
		ev, lc := s.slim(events.CRINamespace, at, c, s.knownContainer(events.CRINamespace, at, &c, useKnown))
		return slimmed{ev, lc}
	}

	lc := listed(c, true)
	if lc.known == nil || lc.ev.SandboxID != "sb-known" || lc.imageID != "" || lc.volumes != nil {
		t.Errorf("known after a start: %+v", lc)
	}
	var ev events.ContainerUpserted
	lc.known.fill(&ev)
	if ev.ImageID != known.ImageID || !slices.Equal(ev.VolumeImageIDs, known.VolumeImageIDs) {
		t.Errorf("known facts: %+v", ev)
	}
	ev.VolumeImageIDs[0] = "changed"
	if known.VolumeImageIDs[0] == "changed" {
		t.Error("the event shares the known facts' slice")
	}

	for _, lc := range []slimmed{listed(c, false), listed(func() containers.Container { c := c; c.ID = "c2"; return c }(), true)} {
		if lc.known != nil || lc.ev.SandboxID != "sb-spec" || lc.imageID != hex("a") || !slices.Equal(lc.volumes, []string{"vol:1"}) {
			t.Errorf("decoded: %+v", lc)
		}
		var ev events.ContainerUpserted
		criFacts(&ev, lc.imageID, lc.volumes, func(string) string { return hex("c") })
		if ev.ImageID != hex("a") || !slices.Equal(ev.VolumeImageIDs, []string{hex("c")}) {
			t.Errorf("facts from the refs: %+v", ev)
		}
	}
}
