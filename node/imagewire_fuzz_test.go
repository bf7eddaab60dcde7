package node

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/gcagent/gcagent/events"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// FuzzDecodeImages checks decodeImages against protobuf and containerd's
// client: whatever proto.Unmarshal accepts as a ListImagesResponse,
// decodeImages accepts too and reads the same images from (name, target
// media type, digest and size, creation time, and the labels
// events.ImageLabels keeps).
func FuzzDecodeImages(f *testing.F) {
	target := &types.Descriptor{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: "sha256:" + strings.Repeat("a", 64), Size: 1234,
		Annotations: map[string]string{"org.opencontainers.image.ref.name": "1"}}
	for _, m := range []*imagesapi.ListImagesResponse{
		{Images: []*imagesapi.Image{
			{Name: "docker.io/library/app:1", Labels: map[string]string{events.LabelCRIManaged: "managed", "other": "x"}, Target: target,
				CreatedAt: timestamppb.New(time.Unix(1700000000, 5)), UpdatedAt: timestamppb.New(time.Unix(1700000001, 0))},
			{Name: "pause:3", Labels: map[string]string{events.LabelPinned: "pinned", events.LabelCRIManaged: "managed"}, Target: &types.Descriptor{MediaType: "odd/type", Size: -1}},
			{Name: "bare"},
		}},
		{},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// An image whose target comes in two pieces, which merge.
	one := must(proto.Marshal(&imagesapi.Image{Name: "split", Target: &types.Descriptor{Digest: "sha256:1"}}))
	one = protowire.AppendTag(one, fieldImageTarget, protowire.BytesType)
	one = protowire.AppendBytes(one, must(proto.Marshal(&types.Descriptor{Size: 9})))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, fieldListedImages, protowire.BytesType), one))

	f.Fuzz(func(t *testing.T, b []byte) {
		var m imagesapi.ListImagesResponse
		if proto.Unmarshal(b, &m) != nil {
			return // protobuf refuses it: decodeImages may refuse it or read less
		}
		var got listedImages
		if err := got.decodeImages(b); err != nil {
			t.Fatalf("protobuf accepts what decodeImages refuses: %v", err)
		}
		// Read as gRPC hands it over, in pieces: the same images.
		var pieces mem.BufferSlice
		for rest := b; len(rest) > 0; {
			n := min(len(rest), 1+len(rest)%7)
			pieces = append(pieces, mem.SliceBuffer(rest[:n]))
			rest = rest[n:]
		}
		var streamed listedImages
		if err := streamed.readImages(pieces); err != nil {
			t.Fatalf("protobuf accepts what readImages refuses: %v", err)
		}
		if !reflect.DeepEqual(streamed.evs, got.evs) && (len(streamed.evs) != 0 || len(got.evs) != 0) || !slices.Equal(streamed.targets, got.targets) {
			t.Fatalf("read in pieces %+v %+v, decoded whole %+v %+v", streamed.evs, streamed.targets, got.evs, got.targets)
		}
		if len(got.evs) != len(m.Images) || len(got.targets) != len(m.Images) {
			t.Fatalf("%d images (%d targets), want %d", len(got.evs), len(got.targets), len(m.Images))
		}
		for i, want := range m.Images {
			g, tg := got.evs[i], got.targets[i]
			wt := want.GetTarget()
			if g.Name != want.GetName() || tg.mediaType != wt.GetMediaType() || g.Digest != wt.GetDigest() || tg.size != wt.GetSize() {
				t.Errorf("image %d: got %+v %+v, want %v", i, g, tg, want)
			}
			if at := want.GetCreatedAt().AsTime(); !g.Created.Equal(at) || g.Created.Location() != time.UTC {
				t.Errorf("image %d created: got %v, want %v", i, g.Created, at)
			}
			if wl := events.ImageLabels(want.GetLabels()); !maps.Equal(g.Labels, wl) {
				t.Errorf("image %d labels: got %v, want %v", i, g.Labels, wl)
			}
		}
	})
}

// FuzzDecodeContent checks listedContent's decoding against protobuf:
// whatever proto.Unmarshal accepts as a ListContentResponse is accepted
// and read as the same blobs, each with its gc.ref labels only.
func FuzzDecodeContent(f *testing.F) {
	for _, m := range []*contentapi.ListContentResponse{
		{Info: []*contentapi.Info{
			{Digest: "sha256:m", Size: 500, Labels: map[string]string{labelConfigRef: "sha256:c", labelLayerRef + "0": "sha256:l",
				"containerd.io/distribution.source.docker.io": "library/app"}, CreatedAt: timestamppb.New(time.Unix(5, 0))},
			{Digest: "sha256:c", Size: 10, Labels: map[string]string{labelSnapshotRef + "overlayfs": "sha256:chain"}},
			{Digest: "sha256:l", Size: 1 << 40, Labels: map[string]string{"containerd.io/uncompressed": "sha256:u"}},
			{},
		}},
		{},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m contentapi.ListContentResponse
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		type blob struct {
			dgst   string
			size   int64
			labels map[string]string
		}
		var got []blob
		lc := listedContent{intern: map[string]string{}, each: func(dgst string, size int64, labels gcLabels) {
			var m map[string]string
			for _, l := range labels {
				if m == nil {
					m = map[string]string{}
				}
				if _, dup := m[l.key]; dup {
					t.Errorf("blob %s: label %q twice", dgst, l.key)
				}
				m[l.key] = l.value
			}
			got = append(got, blob{dgst, size, m})
		}}
		if err := lc.decodeContent(b); err != nil {
			t.Fatalf("protobuf accepts what decodeContent refuses: %v", err)
		}
		if len(got) != len(m.Info) {
			t.Fatalf("%d blobs, want %d", len(got), len(m.Info))
		}
		for i, want := range m.Info {
			refs := maps.Clone(want.GetLabels())
			maps.DeleteFunc(refs, func(k, _ string) bool { return !strings.HasPrefix(k, gcRefLabel) })
			if g := got[i]; g.dgst != want.GetDigest() || g.size != want.GetSize() || !maps.Equal(g.labels, refs) || (g.labels != nil && len(g.labels) == 0) {
				t.Errorf("blob %d: got %+v, want %v", i, g, want)
			}
		}
	})
}
