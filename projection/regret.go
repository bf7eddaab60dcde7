package projection

import (
	"slices"
	"time"

	"github.com/gcagent/gcagent/events"
)

// Deletion is an image this agent's GC deleted (events.ImageCollected),
// kept until its regret window ends: when the image comes back on the node
// (its digest, or a name it had) within the window, the deletion was a
// regret. The record is dropped once the regret is reported
// (events.RegretReported), so each deletion is reported once.
type Deletion struct {
	Digest  string    `json:"digest"`
	Names   []string  `json:"names"`
	Size    int64     `json:"size"`
	Freed   int64     `json:"freed,omitempty"`
	Rule    string    `json:"rule"`
	Trigger string    `json:"trigger"`
	At      time.Time `json:"at"`
	Until   time.Time `json:"until"`
	// ReturnedAt is when the image came back, ReturnedAs the name (or the
	// digest) it came back under; zero while it has not.
	ReturnedAt time.Time `json:"returnedAt,omitzero"`
	ReturnedAs string    `json:"returnedAs,omitempty"`
}

// Returned reports whether the image came back within the window.
func (d *Deletion) Returned() bool { return !d.ReturnedAt.IsZero() }

// collected records a deletion by this agent's GC. A new deletion of the
// same digest replaces an older record unless that one's return is still
// to be reported.
func (s *State) collected(e events.ImageCollected) {
	if old := s.Deletions[e.Digest]; old != nil && old.Returned() {
		return
	}
	s.unindexDeletion(e.Digest)
	s.Deletions[e.Digest] = &Deletion{Digest: e.Digest, Names: slices.Clone(e.Names), Size: e.Size, Freed: e.Freed,
		Rule: e.Rule, Trigger: e.Trigger, At: e.At, Until: e.RegretUntil}
	for _, n := range e.Names {
		s.deletedNames[n] = e.Digest
	}
}

// noteReturn marks the deletion an upsert brings back as returned: a
// name not on the node before the event, whose digest or name a deletion
// in its window had. Call it before the upsert is applied.
func (s *State) noteReturn(e events.ImageUpserted) {
	if len(s.Deletions) == 0 {
		return
	}
	if _, had := s.Names[e.Name]; had {
		return
	}
	as := e.Name
	d := s.Deletions[e.Digest]
	if d != nil && s.Images[e.Digest] == nil {
		as = e.Digest
		if slices.Contains(d.Names, e.Name) {
			as = e.Name
		}
	} else if dg, ok := s.deletedNames[e.Name]; ok {
		d = s.Deletions[dg]
	} else {
		d = nil
	}
	if d == nil || d.Returned() || e.At.After(d.Until) || e.At.Before(d.At.Add(-time.Second)) {
		return
	}
	d.ReturnedAt, d.ReturnedAs = e.At, as
}

// regretReported drops the deletion whose return was reported.
func (s *State) regretReported(e events.RegretReported) {
	if d := s.Deletions[e.Digest]; d != nil && d.At.Equal(e.Deleted) {
		s.unindexDeletion(e.Digest)
		delete(s.Deletions, e.Digest)
	}
}

func (s *State) unindexDeletion(digest string) {
	if d := s.Deletions[digest]; d != nil {
		for _, n := range d.Names {
			if s.deletedNames[n] == digest {
				delete(s.deletedNames, n)
			}
		}
	}
}

// indexDeletions rebuilds the name index of the deletions (derived).
func (s *State) indexDeletions() {
	s.deletedNames = map[string]string{}
	if s.Deletions == nil {
		s.Deletions = map[string]*Deletion{}
	}
	for dg, d := range s.Deletions {
		for _, n := range d.Names {
			s.deletedNames[n] = dg
		}
	}
}

// Regrets returns the deletions whose image came back and whose regret is
// not reported yet, oldest deletion first.
func (s *State) Regrets() []Deletion {
	var out []Deletion
	for _, d := range s.Deletions {
		if d.Returned() {
			cp := *d
			cp.Names = slices.Clone(d.Names)
			out = append(out, cp)
		}
	}
	slices.SortFunc(out, func(a, b Deletion) int { return a.At.Compare(b.At) })
	return out
}

// regretGrace is how long a returned deletion waits to be reported
// before it is forgotten anyway.
const regretGrace = 24 * time.Hour

// ForgetDeletionsBefore drops the deletions whose regret window ended
// before t without a return (and returns not reported for a day), so the
// records stay bounded by the window. Live calls it when it takes a
// snapshot.
func (s *State) ForgetDeletionsBefore(t time.Time) {
	for dg, d := range s.Deletions {
		if (!d.Returned() && d.Until.Before(t)) || (d.Returned() && d.ReturnedAt.Add(regretGrace).Before(t)) {
			s.unindexDeletion(dg)
			delete(s.Deletions, dg)
		}
	}
}
