package gc

import (
	"fmt"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// BenchmarkPlanContainersPass is what a container GC pass plans on a busy
// node of running containers with the default --prune-containers=native:
// 10,000 containers, half CRI (running), half plain (running), 100 plain
// ones dead. "full" is the plan `gcagent plan` shows (every container in
// Keep), "pass" the one a GC pass makes.
func BenchmarkPlanContainersPass(b *testing.B) {
	s := projection.New()
	for i := range 5000 {
		id, uid := fmt.Sprintf("cri-%05d", i), fmt.Sprintf("uid-%05d", i/2)
		s.Apply(events.ContainerUpserted{At: at(0), ID: id, Image: "app:1", CRIKind: projection.KindContainer, PodUID: uid,
			ContainerName: "app", SandboxID: "sb-" + uid})
		s.Apply(start(0, id))
		s.Apply(native(0, fmt.Sprintf("plain-%05d", i), "tool:1"))
		s.Apply(start(0, fmt.Sprintf("plain-%05d", i)))
	}
	for i := range 100 {
		for _, ev := range dead(0, time.Minute, fmt.Sprintf("dead-%05d", i), "tool:1") {
			s.Apply(ev)
		}
	}
	s.Apply(events.Synced{At: at(time.Hour)})
	p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneNative}
	for _, mode := range []struct {
		name string
		all  bool
	}{{"full", true}, {"pass", false}} {
		b.Run(mode.name, func(b *testing.B) {
			var plan ContainerPlan
			for b.Loop() {
				plan = planContainers(s, p, at(10*time.Hour), nil, mode.all)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/plan")
			if len(plan.Remove) != 100 {
				b.Fatalf("%d removals, want the 100 dead plain containers", len(plan.Remove))
			}
		})
	}
}

// BenchmarkPlanContainers plans a busy node with --prune-containers=all:
// 5,000 pods with an exited sandbox each and 30,000 containers (25,000 exited
// CRI containers in those pods, 5,000 plain ones). Planning is linear in the
// containers: sandboxes find their pods' containers through one index.
func BenchmarkPlanContainers(b *testing.B) {
	s := projection.New()
	const pods, perPod, plain = 5000, 5, 5000
	for p := range pods {
		uid, sb := fmt.Sprintf("uid-%05d", p), fmt.Sprintf("sb-%05d", p)
		s.Apply(sandbox(0, sb, uid))
		s.Apply(start(0, sb))
		s.Apply(exit(time.Minute, sb))
		for c := range perPod {
			for _, ev := range criDead(time.Duration(c)*time.Second, time.Minute, fmt.Sprintf("c-%05d-%d", p, c), "app:1", uid, fmt.Sprintf("n%d", c%2), sb) {
				s.Apply(ev)
			}
		}
	}
	for i := range plain {
		for _, ev := range dead(0, time.Minute, fmt.Sprintf("plain-%05d", i), "tool:1") {
			s.Apply(ev)
		}
	}
	s.Apply(events.Synced{At: at(time.Hour)})
	p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll}
	if n := len(s.Containers); n != pods+pods*perPod+plain {
		b.Fatalf("%d containers", n)
	}
	b.ResetTimer()
	var plan ContainerPlan
	for b.Loop() {
		plan = PlanContainers(s, p, at(10*time.Hour))
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/plan")
	b.ReportMetric(float64(len(plan.Remove)), "removals")
}
