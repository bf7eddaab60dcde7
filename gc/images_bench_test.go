package gc

import (
	"fmt"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// BenchmarkPlanImages plans the images of a busy node on a full disk with
// the kubelet's thresholds: 10,000 images (a tag and CRI's id name each),
// half held by a CRI container through its image id. Every image GC pass
// and every scrape of the reclaimable-bytes gauge (at most every 5 s) makes
// such a plan, so what it allocates is garbage the agent carries until the
// next collection.
func BenchmarkPlanImages(b *testing.B) {
	const n = 10000
	s := busyImages(n)
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute}
	full := DiskStats{CapacityBytes: 1 << 40, AvailableBytes: 1 << 30}
	var plan ImagePlan
	for b.Loop() {
		plan = PlanImages([]*projection.State{s}, full, p, at(10*time.Hour))
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/plan")
	if len(plan.Delete) == 0 || len(plan.Keep) < n/2 || len(plan.Delete)+len(plan.Keep) != n {
		b.Fatalf("%d to delete, %d kept; want some of the %d images no container holds deleted and the others kept", len(plan.Delete), len(plan.Keep), n/2)
	}
}

// BenchmarkReclaimableBytes: the gauge of what image GC could free, asked
// by every scrape and heartbeat, at 10,000 images; "plan" is how it was
// computed before (a plan on a full disk), "screen" how it is now.
func BenchmarkReclaimableBytes(b *testing.B) {
	const n = 10000
	s := busyImages(n)
	states := []*projection.State{s}
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute, SandboxImages: []string{"registry.test/pause:3.10"}}
	now := at(10 * time.Hour)
	want := reclaimableByPlan(states, p, now)
	if want == 0 {
		b.Fatal("nothing reclaimable: the benchmark measures nothing")
	}
	for _, way := range []struct {
		name string
		f    func() int64
	}{
		{"plan", func() int64 { return reclaimableByPlan(states, p, now) }},
		{"screen", func() int64 { return ReclaimableBytes(states, p, now) }},
	} {
		b.Run(way.name, func(b *testing.B) {
			b.ReportAllocs()
			var got int64
			for b.Loop() {
				got = way.f()
			}
			if got != want {
				b.Fatalf("%d reclaimable bytes, want %d", got, want)
			}
		})
	}
}

// busyImages is a projection of n images (a tag and CRI's id name each),
// half of them used by a running CRI container.
func busyImages(n int) *projection.State {
	s := projection.New()
	for i := range n {
		digest, config := fmt.Sprintf("sha256:%064x", i), fmt.Sprintf("sha256:%064x", n+i)
		for _, name := range []string{fmt.Sprintf("registry.test/app-%d:1", i), config} {
			s.Apply(events.ImageUpserted{At: at(0), Name: name, Digest: digest, Size: 50 << 20, ConfigDigest: config,
				ChainID: fmt.Sprintf("sha256:%064x", 2*n+i), Labels: map[string]string{projection.LabelCRIManaged: "managed"}})
		}
		if i%2 == 0 {
			id := fmt.Sprintf("%064x", 3*n+i)
			s.Apply(events.ContainerUpserted{At: at(0), ID: id, Image: fmt.Sprintf("registry.test/app-%d:1", i),
				ImageDigest: digest, ImageID: config, CRIKind: projection.KindContainer})
			s.Apply(start(0, id))
		}
	}
	s.Apply(events.Synced{At: at(time.Hour)})
	return s
}
