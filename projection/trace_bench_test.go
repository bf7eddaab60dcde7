package projection

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/trace"
)

// churn is a busy node's event mix for the trace's cost: images pulled,
// containers created from them, started, exited and deleted, images
// removed now and then.
func churn(n int) []events.Event {
	var evs []events.Event
	at := t0
	tick := func() time.Time { at = at.Add(time.Millisecond); return at }
	for i := range n {
		name := fmt.Sprintf("registry.test/app-%d:1", i%200)
		digest := fmt.Sprintf("sha256:%064d", i%200)
		id := fmt.Sprintf("c-%d", i)
		evs = append(evs,
			events.ImageUpserted{At: tick(), Name: name, Digest: digest, Size: 1 << 20, Labels: map[string]string{LabelCRIManaged: "managed"}},
			events.ContainerUpserted{At: tick(), ID: id, Image: name, ImageDigest: digest, CRIKind: KindContainer,
				PodUID: fmt.Sprintf("uid-%d", i%50), ContainerName: "app"},
			events.TaskStarted{At: tick(), ContainerID: id, Pid: uint32(i + 100)},
			events.TaskExited{At: tick(), ContainerID: id, Pid: uint32(i + 100), ExitedAt: at},
			events.ContainerDeleted{At: tick(), ID: id},
		)
		if i%10 == 0 {
			evs = append(evs, events.ImageDeleted{At: tick(), Name: name})
		}
	}
	return evs
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTraceReducer measures the tracer alone, side by side: the
// reducer applying a busy node's churn in memory, without and with the
// records it derives. One op is one event.
func BenchmarkTraceReducer(b *testing.B) {
	evs := churn(2000)
	for _, traced := range []bool{false, true} {
		b.Run(fmt.Sprintf("trace=%v", traced), func(b *testing.B) {
			s := New()
			var tr *tracer
			if traced {
				tr = newTracer(s)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ev := evs[i%len(evs)]
				s.Apply(ev)
				if tr != nil {
					tr.observe(s, ev)
					if len(tr.recs) >= flushRecords {
						tr.take()
					}
				}
				i++
			}
		})
	}
}

// BenchmarkTraceCost measures what the usage trace adds to the agent per
// event, side by side in one run: the projection applying a busy node's
// churn and journaling it in batches of 64 (as Spaces gathers them) to
// a real state file, without and with the trace. One op is one event;
// cpu-ns/event is the process's CPU time (user and system) per event.
func BenchmarkTraceCost(b *testing.B) {
	evs := churn(2000)
	const batch = 64
	for _, traced := range []bool{false, true} {
		b.Run(fmt.Sprintf("trace=%v", traced), func(b *testing.B) {
			st, err := OpenStore(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			if traced {
				if _, err := st.OpenTrace(trace.Options{}); err != nil {
					b.Fatal(err)
				}
			}
			l, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return t0 }})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for n, k := 0, 0; n < b.N; n, k = n+batch, k+batch {
				k %= len(evs) - batch
				l.Apply(evs[k : k+batch]...)
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/event")
		})
	}
}
