package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
)

const benchImages, benchContainers = 2000, 2000

// seedRecords creates n distinct images (own config, one shared 1 KiB layer)
// and m containers referencing them, half of them labelled like CRI pods,
// directly through the content, image and container stores.
func seedRecords(b *testing.B, c *testenv.Containerd, n, m int) {
	c.SeedRecords(b, testenv.Seed{Images: n, Containers: m, Prefix: "bench"})
}

// BenchmarkStartupReconcile measures what the agent does at start: list
// images, containers and tasks over the real API and fold the listing into
// the projection. "cold" is a first start (every image size computed);
// "restored" is a restart, where the persisted projection knows the sizes
// and the CRI containers' facts.
func BenchmarkStartupReconcile(b *testing.B) {
	for _, v := range testenv.Versions() {
		b.Run("containerd-"+string(v), func(b *testing.B) {
			c := testenv.StartContainerd(b, testenv.Options{Version: v})
			seedRecords(b, c, benchImages, benchContainers)
			known := projection.New()
			for _, mode := range []string{"cold", "restored"} {
				b.Run(mode, func(b *testing.B) {
					for b.Loop() {
						opts := node.Options{Client: c.Client}
						if mode == "restored" {
							opts.KnownFacts = func(d string) node.ImageFacts {
								if img := known.Images[d]; img != nil {
									return node.ImageFacts{Size: img.Size, Config: img.ConfigDigest, Chain: img.ChainID}
								}
								return node.ImageFacts{}
							}
							opts.KnownContainer = func(_, id string, created time.Time) (node.ContainerFacts, bool) {
								if c := known.Containers[id]; c != nil && c.Created.Time().Equal(created) {
									return node.ContainerFacts{SandboxID: c.SandboxID, ImageID: c.ImageID, VolumeImageIDs: c.VolumeImageIDs()}, true
								}
								return node.ContainerFacts{}, false
							}
						}
						l, err := node.NewSource(opts).List(context.Background(), testenv.Namespace)
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
