package projection

import (
	"fmt"
	"runtime"
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

// BenchmarkStateMemory measures what the projection of a busy node holds
// in the heap: 10,000 images (each with a tag and CRI's id name, labelled
// as CRI labels them) and 10,000 containers, half CRI containers in 2,500
// pods, half plain, all running.
func BenchmarkStateMemory(b *testing.B) {
	const n = 10000
	var keep *State
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		keep = busyNode(n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB")
	}
	runtime.KeepAlive(keep)
}

// busyNode is the projection of a busy node: n images (each with a tag and
// CRI's id name, labelled as CRI labels them) and n running containers,
// half CRI containers in pods, half plain.
func busyNode(n int) *State {
	s := New()
	for i := range n {
		digest, config := fmt.Sprintf("sha256:%064x", i), fmt.Sprintf("sha256:%064x", n+i)
		for _, name := range []string{fmt.Sprintf("registry.test/team-%d/app-%d:1.%d", i%50, i, i%7), config} {
			s.Apply(events.ImageUpserted{At: t0, Name: name, Digest: digest, Size: 50 << 20, ConfigDigest: config,
				ChainID: fmt.Sprintf("sha256:%064x", 2*n+i), Labels: map[string]string{LabelCRIManaged: "managed"}})
		}
		id := fmt.Sprintf("%064x", 3*n+i)
		ev := events.ContainerUpserted{At: t0, ID: id, Image: fmt.Sprintf("registry.test/team-%d/app-%d:1.%d", i%50, i, i%7),
			ImageDigest: digest, ImageID: config, RootChain: fmt.Sprintf("sha256:%064x", 2*n+i)}
		if i%2 == 0 {
			uid := fmt.Sprintf("%08x-0000-0000-0000-%012x", i/4, i/4)
			ev.CRIKind, ev.PodUID, ev.PodName, ev.PodNamespace, ev.ContainerName, ev.SandboxID =
				KindContainer, uid, fmt.Sprintf("app-%d", i/4), "default", fmt.Sprintf("c%d", i%4), fmt.Sprintf("%064x", 4*n+i/4)
		}
		s.Apply(ev)
		s.Apply(events.TaskStarted{At: t0, ContainerID: id, Pid: uint32(i + 1)})
	}
	return s
}
