package projection

import (
	"hash/maphash"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/trace"
)

// tracer derives a namespace's usage trace (package trace) from the events
// its projection applies: it compares each image an event touched with
// what it last recorded of it. It costs a few map operations per event
// and no call to containerd. Live owns one when its Store keeps a trace.
type tracer struct {
	ns    string
	marks map[string]mark // by digest: what the trace last said of each image
	recs  []trace.Record  // made since the last take, in memory only: the journal can make them again
	since time.Time       // when recs stopped being empty (due)
}

// mark is what the trace last said of an image.
type mark struct {
	names  uint64 // hash of its names
	size   int64
	pinned bool
	used   bool
}

var namesSeed = maphash.MakeSeed()

func namesHash(img *Image) uint64 {
	var h maphash.Hash
	h.SetSeed(namesSeed)
	for _, n := range img.Names {
		h.WriteString(n.Name)
		h.WriteByte(0)
	}
	return h.Sum64()
}

// newTracer starts from state s, which the trace already holds (a
// restored projection) or which base records.
func newTracer(s *State) *tracer {
	t := &tracer{ns: s.Namespace, marks: make(map[string]mark, len(s.Images))}
	for d, img := range s.Images {
		t.marks[d] = t.markOf(s, img)
	}
	s.tracing = true
	return t
}

func (t *tracer) markOf(s *State, img *Image) mark {
	return mark{names: namesHash(img), size: img.Size, pinned: img.Pinned(), used: s.ImageInUse(img)}
}

// base returns records of every image of s, as a trace that starts at at
// must hold them: first seen, last used, and whether a container holds it.
func (t *tracer) base(s *State, at time.Time) []trace.Record {
	out := make([]trace.Record, 0, len(s.Images))
	for _, img := range s.Images {
		r := t.image(img, at)
		r.FirstSeen, r.LastUsed, r.Used = img.FirstSeen.Time(), img.LastUsed.Time(), s.ImageInUse(img)
		out = append(out, r)
	}
	return out
}

func (t *tracer) image(img *Image, at time.Time) trace.Record {
	return trace.Record{T: at, Ev: trace.KindImage, NS: t.ns, Digest: img.Digest, Names: img.Names.Strings(),
		Size: img.Size, Pinned: img.Pinned()}
}

// observe records what ev, just applied to s, changed: an image that
// arrived, changed names, size or pin, became used or idle, or left; and
// a removal by image GC.
func (t *tracer) observe(s *State, ev events.Event) {
	at := ev.Time()
	if e, ok := ev.(events.ImageCollected); ok {
		t.recs = append(t.recs, trace.Record{T: e.At, Ev: trace.KindGC, NS: t.ns, Digest: e.Digest, Names: e.Names,
			Size: e.Size, Freed: e.Freed, Rule: e.Rule, Trigger: e.Trigger})
	}
	kind := ev.Kind()
	names := kind == events.KindImageUpserted || kind == events.KindImageDeleted
	for i, d := range s.touched {
		if seen(s.touched[:i], d) {
			continue
		}
		img := s.Images[d]
		m, had := t.marks[d]
		if img == nil {
			if had {
				delete(t.marks, d)
				t.recs = append(t.recs, trace.Record{T: at, Ev: trace.KindGone, NS: t.ns, Digest: d})
			}
			continue
		}
		used := s.ImageInUse(img)
		switch {
		case !had:
			m = t.markOf(s, img)
			t.recs = append(t.recs, t.image(img, img.FirstSeen.Time()))
			m.used = false // said next, if it is
		case names:
			if n := t.markOf(s, img); n.names != m.names || n.size != m.size || n.pinned != m.pinned {
				m.names, m.size, m.pinned = n.names, n.size, n.pinned
				t.recs = append(t.recs, t.image(img, at))
			}
		}
		if used != m.used {
			m.used = used
			r := trace.Record{T: at, Ev: trace.KindUse, NS: t.ns, Digest: d}
			if !used {
				r.Ev, r.T = trace.KindIdle, img.LastUsed.Time()
			}
			t.recs = append(t.recs, r)
		}
		t.marks[d] = m
	}
	s.touched = s.touched[:0]
}

// seen reports whether d is in ds (a handful: an event touches few images).
func seen(ds []string, d string) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// Records wait in memory until a thousand are there, or the oldest has
// waited a minute, or a snapshot is written: then they go into the trace
// in the journal's transaction. The journal's events make them again after
// a crash (Store.Load), so none is lost and the trace costs the agent no
// write of its own.
const (
	flushRecords = 1024
	flushAfter   = time.Minute
)

// due reports whether the records made so far should go into the trace
// with the batch being journaled at now.
func (t *tracer) due(now time.Time) bool {
	if len(t.recs) == 0 {
		t.since = time.Time{}
		return false
	}
	if t.since.IsZero() {
		t.since = now
	}
	return len(t.recs) >= flushRecords || now.Sub(t.since) >= flushAfter || now.Before(t.since)
}

// take returns the records made since the last take.
func (t *tracer) take() []trace.Record {
	recs := t.recs
	t.recs, t.since = nil, time.Time{}
	return recs
}

// maxPending bounds the records kept for the next write while writes
// fail (a full state disk): a gap in the trace is better than a heap that
// grows.
const maxPending = 1 << 16

// keep puts back records whose write failed, for the next write, unless
// there are too many: it returns how many it dropped.
func (t *tracer) keep(recs []trace.Record) int {
	if len(recs)+len(t.recs) > maxPending {
		return len(recs)
	}
	t.recs = append(recs, t.recs...)
	return 0
}
