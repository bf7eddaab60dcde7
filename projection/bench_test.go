package projection

import (
	"fmt"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
)

// BenchmarkApply measures the reducer on a realistic mix: images pulled and
// retagged, containers created, started, exited and deleted, pods with
// sandboxes, image deletes. One op is one event.
func BenchmarkApply(b *testing.B) {
	var evs []events.Event
	at := t0
	tick := func() time.Time { at = at.Add(time.Millisecond); return at }
	for i := range 1000 {
		img := fmt.Sprintf("registry.test/app-%d:1", i%200)
		digest := fmt.Sprintf("sha256:%064d", i%200)
		id := fmt.Sprintf("c-%d", i)
		sb := fmt.Sprintf("sb-%d", i%50)
		evs = append(evs,
			events.ImageUpserted{At: tick(), Name: img, Digest: digest, Size: 1 << 20, Labels: map[string]string{LabelCRIManaged: "managed"}},
			events.ContainerUpserted{At: tick(), ID: sb, Image: "registry.test/pause:3.10", CRIKind: KindSandbox, PodUID: fmt.Sprintf("uid-%d", i%50)},
			events.ContainerUpserted{At: tick(), ID: id, Image: img, CRIKind: KindContainer, PodUID: fmt.Sprintf("uid-%d", i%50), ContainerName: "app", SandboxID: sb},
			events.TaskStarted{At: tick(), ContainerID: id, Pid: uint32(i + 100)},
			events.TaskExited{At: tick(), ContainerID: id, Pid: uint32(i + 100), ExitedAt: at},
			events.ContainerDeleted{At: tick(), ID: id},
		)
		if i%10 == 0 {
			evs = append(evs, events.ImageDeleted{At: tick(), Name: img})
		}
	}
	s := New()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s.Apply(evs[i%len(evs)])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
