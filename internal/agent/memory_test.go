package agent

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

func TestWorthReturning(t *testing.T) {
	const mib = 1 << 20
	busy := heapSample{allocs: 100 * mib}
	for _, tt := range []struct {
		name      string
		prev, now heapSample
		want      bool
	}{
		{"quiet after work that left garbage", busy, heapSample{allocs: 100*mib + 1000, objects: 60 * mib, live: 30 * mib}, true},
		{"still allocating", busy, heapSample{allocs: 110 * mib, objects: 60 * mib, live: 30 * mib}, false},
		{"garbage under an eighth of the live heap", busy, heapSample{allocs: 100 * mib, objects: 33 * mib, live: 30 * mib}, false},
		{"garbage of an eighth of the live heap", busy, heapSample{allocs: 100 * mib, objects: 34 * mib, live: 30 * mib}, true},
		{"a small heap's garbage under 2 MiB", busy, heapSample{allocs: 100 * mib, objects: 3 * mib, live: 2 * mib}, false},
		{"a small heap's garbage of 2 MiB", busy, heapSample{allocs: 100 * mib, objects: 4 * mib, live: 2 * mib}, true},
		{"no garbage, free pages kept after a collection", busy, heapSample{allocs: 100 * mib, objects: 30 * mib, live: 30 * mib, free: 20 * mib}, true},
		{"garbage and free pages under an eighth together", busy, heapSample{allocs: 100 * mib, objects: 32 * mib, live: 30 * mib, free: mib}, false},
		{"live above objects (a collection under way)", busy, heapSample{allocs: 100 * mib, objects: 20 * mib, live: 30 * mib}, false},
	} {
		if got := worthReturning(tt.prev, tt.now); got != tt.want {
			t.Errorf("%s: worthReturning = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestReadHeap: every metric readHeap asks for exists in this runtime (an
// unknown name reads as zero, and zero is never worth returning), and
// garbage made since a collection shows as objects over live.
func TestReadHeap(t *testing.T) {
	known := map[string]bool{}
	for _, d := range metrics.All() {
		known[d.Name] = true
	}
	for _, name := range heapMetrics {
		if !known[name] {
			t.Errorf("runtime/metrics has no %s", name)
		}
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection in between
	runtime.GC()
	before := readHeap()
	var keep [][]byte
	for range 64 {
		keep = append(keep, make([]byte, 64<<10))
	}
	keep = nil
	now := readHeap()
	if before.live == 0 || now.objects == 0 || now.allocs-before.allocs < 4<<20 {
		t.Fatalf("before %+v, now %+v: want a live heap, objects, and the 4 MiB allocated since", before, now)
	}
	if now.objects-now.live < 3<<20 {
		t.Fatalf("now %+v: want the 4 MiB of garbage (3 at least) as objects over live", now)
	}
	runtime.KeepAlive(keep)
}

// TestSampleAllocations: allocations are sampled (heap profiles) with
// --profiling and not without.
func TestSampleAllocations(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	const rate = 512 << 10
	runtime.MemProfileRate = rate
	sampleAllocations(true)
	if runtime.MemProfileRate != rate {
		t.Fatalf("with --profiling the rate is %d, want %d", runtime.MemProfileRate, rate)
	}
	sampleAllocations(false)
	if runtime.MemProfileRate != 0 {
		t.Fatalf("without --profiling the rate is %d, want 0", runtime.MemProfileRate)
	}
}
