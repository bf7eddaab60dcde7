package node

import (
	"bytes"
	"maps"
	"testing"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/containerd/containerd/v2/core/containers"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// FuzzDecodeListed checks decodeListed against protobuf: whatever
// proto.Unmarshal accepts as a ListContainerMessage, decodeListed accepts
// too and reads the same fields from, with and without the bodies.
func FuzzDecodeListed(f *testing.F) {
	full := &containersapi.Container{
		ID:          "c1",
		Labels:      map[string]string{labelCRIKind: "container", labelPodUID: "uid"},
		Image:       "docker.io/library/app:1",
		Runtime:     &containersapi.Container_Runtime{Name: "io.containerd.runc.v2", Options: &anypb.Any{TypeUrl: "opts", Value: []byte{1}}},
		Spec:        &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Spec", Value: []byte(`{"annotations":{"a":"b"}}`)},
		Snapshotter: "overlayfs",
		SnapshotKey: "c1",
		CreatedAt:   timestamppb.New(time.Unix(1700000000, 123456789)),
		UpdatedAt:   timestamppb.New(time.Unix(1700000001, 0)),
		Extensions: map[string]*anypb.Any{
			extCRIContainerMetadata: {TypeUrl: "github.com/containerd/cri/pkg/store/container/Metadata", Value: []byte(`{"Metadata":{"ImageRef":"sha256:aa"}}`)},
			"other":                 {TypeUrl: "x", Value: []byte("y")},
		},
		Sandbox: "sb",
	}
	for _, m := range []*containersapi.ListContainerMessage{
		{Container: full},
		{Container: &containersapi.Container{ID: "bare"}},
		{},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// A record in two pieces, which merge; an entry without a value.
	two := protowire.AppendTag(nil, fieldListedContainer, protowire.BytesType)
	two = protowire.AppendBytes(two, must(proto.Marshal(&containersapi.Container{ID: "first", Labels: map[string]string{"a": "1"}, CreatedAt: &timestamppb.Timestamp{Seconds: 5}})))
	two = protowire.AppendTag(two, fieldListedContainer, protowire.BytesType)
	two = protowire.AppendBytes(two, must(proto.Marshal(&containersapi.Container{ID: "second", Labels: map[string]string{"b": "2"}, CreatedAt: &timestamppb.Timestamp{Nanos: 7}})))
	two = protowire.AppendTag(two, fieldListedContainer, protowire.BytesType)
	entry := protowire.AppendTag(nil, fieldKey, protowire.BytesType)
	entry = protowire.AppendString(entry, extCRIContainerMetadata)
	rec := protowire.AppendTag(nil, fieldExtensions, protowire.BytesType)
	two = protowire.AppendBytes(two, protowire.AppendBytes(rec, entry))
	f.Add(two)
	// Nanos wider than their int32, which protobuf truncates.
	ts := protowire.AppendVarint(protowire.AppendTag(nil, fieldNanos, protowire.VarintType), 1<<32|5)
	odd := protowire.AppendBytes(protowire.AppendTag(nil, fieldCreatedAt, protowire.BytesType), ts)
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, fieldListedContainer, protowire.BytesType), odd))

	f.Fuzz(func(t *testing.T, b []byte) {
		var m containersapi.ListContainerMessage
		if proto.Unmarshal(b, &m) != nil {
			return // protobuf refuses it: decodeListed may refuse it or read less
		}
		want := m.GetContainer()
		for _, withBodies := range []bool{false, true} {
			var asked *containers.Container
			c, err := decodeListed(b, func(c *containers.Container) bool {
				asked = c
				return withBodies
			})
			if err != nil {
				t.Fatalf("protobuf accepts what decodeListed refuses: %v", err)
			}
			if asked == nil || asked.ID != want.GetID() {
				t.Errorf("bodies not asked with the record: %+v", asked)
			}
			if c.ID != want.GetID() || c.Image != want.GetImage() || c.Snapshotter != want.GetSnapshotter() ||
				c.SnapshotKey != want.GetSnapshotKey() || c.SandboxID != want.GetSandbox() || !maps.Equal(c.Labels, want.GetLabels()) {
				t.Errorf("fields: got %+v, want %+v", c, want)
			}
			if at := want.GetCreatedAt().AsTime(); !c.CreatedAt.Equal(at) || c.CreatedAt.Location() != time.UTC {
				t.Errorf("created: got %v, want %v", c.CreatedAt, at)
			}
			if !withBodies {
				if c.Spec != nil || c.Extensions != nil {
					t.Errorf("bodies read though not wanted: %+v", c)
				}
				continue
			}
			if !sameAny(c.Spec, want.GetSpec()) {
				t.Errorf("spec: got %v, want %v", c.Spec, want.GetSpec())
			}
			meta, ok := want.GetExtensions()[extCRIContainerMetadata]
			if len(c.Extensions) > 1 || (c.Extensions[extCRIContainerMetadata] != nil) != ok || !sameAny(c.Extensions[extCRIContainerMetadata], meta) {
				t.Errorf("extensions: got %v, want CRI's of %v", c.Extensions, want.GetExtensions())
			}
		}
	})
}

// sameAny compares what a listing reads of an Any: its type and value.
func sameAny(got interface {
	GetTypeUrl() string
	GetValue() []byte
}, want *anypb.Any) bool {
	if got == nil || want == nil {
		return got == nil && want == nil
	}
	return got.GetTypeUrl() == want.GetTypeUrl() && bytes.Equal(got.GetValue(), want.GetValue())
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
