package agent

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/rs/zerolog"
)

// The Go runtime collects when the heap has grown by GOGC percent (100) over
// what was live after the last collection, and an idle agent allocates
// almost nothing. So the garbage of its last work (an image plan of a busy
// node is megabytes; a snapshot, a listing) stays resident, up to the size
// of the projection again, until the next work comes; and what a
// collection frees stays resident too, as the runtime's scavenger keeps
// the pages of a heap up to its next goal (twice the live heap).
// returnWhenQuiet collects the garbage and gives the free pages back, once
// the agent has gone quiet.
const (
	// memoryCheckEvery is how often the heap is looked at.
	memoryCheckEvery = 5 * time.Second
	// quietAllocBytes: an interval that allocated less is quiet.
	quietAllocBytes = 1 << 20
	// minReturnBytes: less garbage and free pages are not worth a
	// collection.
	minReturnBytes = 2 << 20
	// returnShare: nor is less than this share of the live heap (a forced
	// collection marks the live heap: at 10,000 images and containers,
	// 25 MiB in about 10 ms, for 3 MiB returned).
	returnShare = 8
)

// sampleAllocations keeps Go's allocation sampling (heap profiles) for
// --profiling only. The runtime samples an allocation in every 512 KiB by
// default, and the table of sampled call stacks it keeps stays resident:
// 1.2 MiB of an idle agent at 10,000 images and containers, a thirtieth of
// its memory, on every node, for profiles nobody asked for.
func sampleAllocations(profiling bool) {
	if !profiling {
		runtime.MemProfileRate = 0
	}
}

// heapSample is what returnWhenQuiet reads of the heap.
type heapSample struct {
	allocs  uint64 // bytes allocated since the process started
	objects uint64 // bytes in heap objects now, live or garbage not yet collected
	live    uint64 // bytes live after the last collection
	free    uint64 // bytes of free heap pages still resident (not yet returned)
}

// worthReturning decides from two samples one interval apart: the agent
// allocated little in between (a collection now will not be followed by
// the same garbage at once), and the garbage and free pages it would
// return are at least minReturnBytes and 1/returnShare of the live heap.
func worthReturning(prev, now heapSample) bool {
	garbage := now.objects - min(now.live, now.objects)
	return now.allocs-prev.allocs < quietAllocBytes && garbage+now.free >= max(minReturnBytes, now.live/returnShare)
}

var heapMetrics = []string{"/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/live:bytes", "/memory/classes/heap/free:bytes"}

// readHeap samples the heap without stopping the world.
func readHeap() heapSample {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	value := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0 // not in this runtime: never worth returning
		}
		return s[i].Value.Uint64()
	}
	return heapSample{allocs: value(0), objects: value(1), live: value(2), free: value(3)}
}

// returnWhenQuiet checks the heap every memoryCheckEvery and, when
// worthReturning, collects and returns the free pages to the system. The
// first time it finds the agent started (started reports whether the
// projection is synced), it also returns the binary's pages the start used
// (pageOutBinary) and gives the agent one processor (oneProcessor).
func returnWhenQuiet(ctx context.Context, log zerolog.Logger, started func() bool) error {
	t := time.NewTicker(memoryCheckEvery)
	defer t.Stop()
	prev := readHeap()
	settled := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := readHeap()
		if !settled && started() {
			settled = true
			returnBinaryPages(log, "synced: the binary's pages only the first listing used returned to the kernel")
			if before, changed := oneProcessor(); changed {
				log.Info().Int("gomaxprocs_before", before).Msg("started: one processor from now on (GOMAXPROCS sets it otherwise)")
			}
		}
		if worthReturning(prev, now) {
			debug.FreeOSMemory()
			after := readHeap()
			log.Debug().Uint64("garbage_bytes", now.objects-min(now.live, now.objects)).Uint64("free_bytes", now.free).Uint64("live_bytes", after.live).
				Msg("quiet: heap garbage collected and returned")
			now = after
		}
		prev = now
	}
}
