package projection

import (
	"fmt"
	"path/filepath"
	"runtime"
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
// event, side by side in one run: two projections, one keeping the trace,
// apply a busy node's churn and journal it to real state files in
// batches of 64 (as Spaces gathers them), taking turns batch by batch so
// that the machine's load weighs on both alike. One op is one event
// applied by each; cpu-ns/event is the process's CPU time (user and
// system, the garbage collector's included) over the batches of each.
func BenchmarkTraceCost(b *testing.B) {
	evs := churn(2000)
	const batch = 64
	lives := make([]*Live, 2)
	for i := range lives {
		st, err := OpenStore(filepath.Join(b.TempDir(), "state.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if i == 1 {
			if _, err := st.OpenTrace(trace.Options{}); err != nil {
				b.Fatal(err)
			}
		}
		if lives[i], err = NewLive(LiveOptions{Store: st, Now: func() time.Time { return t0 }}); err != nil {
			b.Fatal(err)
		}
	}
	var cpu [2]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for n, k := 0, 0; n < b.N; n, k = n+batch, k+batch {
		k %= len(evs) - batch
		for i, l := range lives {
			c := cpuTime()
			l.Apply(evs[k : k+batch]...)
			cpu[i] += cpuTime() - c
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu[0])/float64(b.N), "cpu-ns/event-untraced")
	b.ReportMetric(float64(cpu[1])/float64(b.N), "cpu-ns/event-traced")
	b.ReportMetric(float64(cpu[1]-cpu[0])/float64(b.N), "cpu-ns/event-added")
}

// BenchmarkTraceMemory measures what the usage trace keeps in the heap
// beside a busy node's projection (10,000 images and containers, then a
// churn of a thousand events): the tracer's marks and the records waiting
// for their write.
func BenchmarkTraceMemory(b *testing.B) {
	const n = 10000
	node := busyNode(n)
	var listing events.Listing
	listing.At = t0
	for _, img := range node.Images {
		for _, nm := range img.Names {
			listing.Images = append(listing.Images, events.ImageUpserted{At: t0, Name: nm.Name, Digest: img.Digest, Size: img.Size,
				ConfigDigest: img.ConfigDigest, ChainID: img.ChainID, Labels: nm.Labels})
		}
	}
	for _, c := range node.Containers {
		listing.Containers = append(listing.Containers, events.ContainerUpserted{At: t0, ID: c.ID, Image: c.Image,
			ImageDigest: c.ImageDigest, ImageID: c.ImageID, RootChain: c.RootChain})
	}
	evs := churn(200)[:1000]
	for b.Loop() {
		var heap [2]float64
		for i, traced := range []bool{false, true} {
			st, err := OpenStore(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			if traced {
				if _, err := st.OpenTrace(trace.Options{}); err != nil {
					b.Fatal(err)
				}
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			l, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return t0 }})
			if err != nil {
				b.Fatal(err)
			}
			l.Apply(listing)
			for _, ev := range evs {
				l.Apply(ev)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			heap[i] = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
			runtime.KeepAlive(l)
			st.Close()
		}
		b.ReportMetric(heap[0], "untraced-MiB")
		b.ReportMetric(heap[1], "traced-MiB")
	}
}
