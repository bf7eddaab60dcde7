package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
	"github.com/opencontainers/go-digest"
	ispecs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
)

const benchImages, benchContainers = 2000, 2000

// seedRecords creates n distinct images (own config, one shared 1 KiB layer)
// and m containers referencing them, half of them labelled like CRI pods,
// directly through the content, image and container stores.
func seedRecords(b *testing.B, c *testenv.Containerd, n, m int) {
	ctx := c.Ctx()
	cs := c.Client.ContentStore()
	put := func(mediaType string, data []byte, labels map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		if err := content.WriteBlob(ctx, cs, d.Digest.String(), bytes.NewReader(data), d, content.WithLabels(labels)); err != nil {
			b.Fatal(err)
		}
		return d
	}
	layer := put(ocispec.MediaTypeImageLayer, bytes.Repeat([]byte{7}, 1024), nil)
	for i := range n {
		cfg, _ := json.Marshal(ocispec.Image{
			Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
			Config:   ocispec.ImageConfig{Labels: map[string]string{"i": fmt.Sprint(i)}},
			RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer.Digest}},
		})
		cd := put(ocispec.MediaTypeImageConfig, cfg, nil)
		mf, _ := json.Marshal(ocispec.Manifest{Versioned: ispecs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cd, Layers: []ocispec.Descriptor{layer}})
		md := put(ocispec.MediaTypeImageManifest, mf, map[string]string{
			"containerd.io/gc.ref.content.config": cd.Digest.String(), "containerd.io/gc.ref.content.l.0": layer.Digest.String(),
		})
		if _, err := c.Client.ImageService().Create(ctx, images.Image{Name: fmt.Sprintf("bench.test/img-%04d:1", i), Target: md}); err != nil {
			b.Fatal(err)
		}
	}
	spec, err := typeurl.MarshalAny(&specs.Spec{Version: specs.Version})
	if err != nil {
		b.Fatal(err)
	}
	for i := range m {
		labels := map[string]string{}
		if i%2 == 0 {
			labels = map[string]string{"io.cri-containerd.kind": "container", "io.kubernetes.pod.uid": fmt.Sprintf("uid-%d", i/4),
				"io.kubernetes.container.name": fmt.Sprintf("c%d", i%4)}
		}
		if _, err := c.Client.ContainerService().Create(ctx, containers.Container{
			ID: fmt.Sprintf("bench-%04d", i), Image: fmt.Sprintf("bench.test/img-%04d:1", i%n), Labels: labels,
			Runtime: containers.RuntimeInfo{Name: "io.containerd.runc.v2"}, Spec: spec,
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStartupReconcile measures what the agent does at start: list
// images, containers and tasks over the real API and fold the listing into
// the projection. "cold" is a first start (every image size computed);
// "restored" is a restart, where the persisted projection knows the sizes.
func BenchmarkStartupReconcile(b *testing.B) {
	for _, v := range testenv.Versions() {
		b.Run("containerd-"+string(v), func(b *testing.B) {
			c := testenv.StartContainerd(b, testenv.Options{Version: v})
			seedRecords(b, c, benchImages, benchContainers)
			known := projection.New()
			for _, mode := range []string{"cold", "restored"} {
				b.Run(mode, func(b *testing.B) {
					for b.Loop() {
						opts := events.Options{Client: c.Client}
						if mode == "restored" {
							opts.KnownFacts = func(d string) events.ImageFacts {
								if img := known.Images[d]; img != nil {
									return events.ImageFacts{Size: img.Size, Config: img.ConfigDigest, Chain: img.ChainID}
								}
								return events.ImageFacts{}
							}
						}
						l, err := events.NewSource(opts).List(context.Background(), testenv.Namespace)
						if err != nil {
							b.Fatal(err)
						}
						s := projection.New()
						for _, ev := range projection.Reconcile(s, l) {
							s.Apply(ev)
						}
						if len(s.Images) != benchImages || len(s.Containers) != benchContainers || s.Images[l.Images[0].Digest].Size == 0 {
							b.Fatalf("reconciled %d images, %d containers", len(s.Images), len(s.Containers))
						}
						known = s
					}
					b.ReportMetric(float64(benchImages+benchContainers)*float64(b.N)/b.Elapsed().Seconds(), "objects/s")
				})
			}
		})
	}
}
