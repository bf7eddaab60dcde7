package trace

import (
	"bufio"
	"cmp"
	"io"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// pairWindow is how far apart in time an image's removal from the
// projection and its image GC's record of the delete may lie and still be
// one removal: containerd's event and the executor's record reach the
// projection separately.
const pairWindow = time.Minute

// Canonical returns recs in time order (records of one instant keep their
// order) with each removal as one KindRemoved record: a KindGone becomes
// one by this agent's image GC (with its rule, trigger and bytes freed)
// when a KindGC record of the same image lies within a minute before it,
// or after it and before the image came back; else it was removed by
// someone else. A KindGC that matches no removal is dropped. recs is not
// changed.
func Canonical(recs []Record) []Record {
	out := slices.Clone(recs)
	slices.SortStableFunc(out, func(a, b Record) int { return a.T.Compare(b.T) })
	type gone struct {
		i int // index in out of the removal, made by someone else so far
		t time.Time
	}
	pending := map[key]Record{} // GC records waiting for their removal
	last := map[key]gone{}      // the latest removal by someone else
	present := map[key]bool{}
	n := 0
	for _, r := range out {
		k := r.key()
		switch r.Ev {
		case KindImage:
			if !present[k] {
				present[k] = true
				delete(pending, k) // its removal was never recorded
				delete(last, k)
			}
		case KindGC:
			if g, ok := last[k]; ok && !g.t.Before(r.T.Add(-pairWindow)) && !g.t.After(r.T.Add(pairWindow)) {
				byAgent(&out[g.i], r)
				delete(last, k)
			} else {
				pending[k] = r
			}
			continue // never kept as such
		case KindGone, KindRemoved:
			delete(present, k)
			if r.Ev == KindRemoved && r.By != "" {
				break // already paired
			}
			r.Ev, r.By = KindRemoved, ByOther
			if gc, ok := pending[k]; ok && !r.T.Before(gc.T.Add(-pairWindow)) {
				byAgent(&r, gc)
				delete(pending, k)
			} else {
				last[k] = gone{n, r.T}
			}
		}
		out[n] = r
		n++
	}
	clear(out[n:])
	return out[:n]
}

// byAgent makes removal r one by this agent's image GC, as gc says.
func byAgent(r *Record, gc Record) {
	r.Ev, r.By, r.Rule, r.Trigger, r.Freed = KindRemoved, ByAgent, gc.Rule, gc.Trigger, gc.Freed
	if r.Size == 0 {
		r.Size = gc.Size
	}
	if len(r.Names) == 0 {
		r.Names = gc.Names
	}
}

// Fold returns the base of a trace that starts after recs: the images
// present then in each namespace (each one KindImage record with its first
// seen and last used times, and whether a container held it), the last
// policy and the last disk measurement, all at the time of the last record
// (at when recs is empty). base is an earlier base (its records come
// first); neither is changed.
func Fold(base, recs []Record, at time.Time) []Record {
	imgs := map[key]*Record{}
	var policy, disk *Record
	apply := func(r Record) {
		if r.T.After(at) {
			at = r.T
		}
		k := r.key()
		switch r.Ev {
		case KindImage:
			img := imgs[k]
			if img == nil {
				img = &Record{Ev: KindImage, NS: r.NS, Digest: r.Digest, FirstSeen: cmp.Or(r.FirstSeen, r.T),
					LastUsed: r.LastUsed, Used: r.Used}
				imgs[k] = img
			}
			img.Names, img.Pinned = r.Names, r.Pinned
			if r.Size > 0 {
				img.Size = r.Size
			}
		case KindUse, KindIdle:
			if img := imgs[k]; img != nil {
				img.Used = r.Ev == KindUse
				if r.T.After(img.LastUsed) {
					img.LastUsed = r.T
				}
			}
		case KindGone, KindRemoved:
			delete(imgs, k)
		case KindPolicy:
			p := r
			policy = &p
		case KindDisk:
			d := r
			disk = &d
		}
	}
	for _, r := range base {
		apply(r)
	}
	for _, r := range recs {
		apply(r)
	}
	out := make([]Record, 0, len(imgs)+2)
	for _, r := range []*Record{policy, disk} {
		if r != nil {
			r.T = at
			out = append(out, *r)
		}
	}
	n := len(out)
	for _, img := range imgs {
		img.T = at
		out = append(out, *img)
	}
	slices.SortFunc(out[n:], func(a, b Record) int {
		return cmp.Or(strings.Compare(a.NS, b.NS), a.FirstSeen.Compare(b.FirstSeen), strings.Compare(a.Digest, b.Digest))
	})
	return out
}

// Load returns the trace stored in db (Read), in time order with each
// removal as one record (Canonical), and what it could not read and
// skipped.
func Load(db *bolt.DB) ([]Record, Skipped, error) {
	var recs []Record
	skipped, err := Read(db, func(r Record) error { recs = append(recs, r); return nil })
	if err != nil {
		return nil, skipped, err
	}
	return Canonical(recs), skipped, nil
}

// Export writes a trace as JSON lines: the header h (its kind, version and
// window set here), then recs (canonical: Load's).
func Export(w io.Writer, h Record, recs []Record) error {
	h.Ev, h.Version = KindHeader, Version
	if len(recs) > 0 {
		h.From, h.To = recs[0].T, recs[len(recs)-1].T
	}
	if h.T.IsZero() {
		h.T = h.To
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	if err := Encode(bw, h); err != nil {
		return err
	}
	if err := Encode(bw, recs...); err != nil {
		return err
	}
	return bw.Flush()
}
