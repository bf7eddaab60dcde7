// Package declared is the cluster's keep list: the images that the
// workloads a cluster declares name (Pods, Deployments and the ReplicaSets
// a rollback would use, StatefulSets, DaemonSets, Jobs, CronJobs, their
// revisions), each with the workloads that name it, kept for a grace period
// once the last of them stops naming it. The cluster component
// (internal/cluster) feeds a Set from its informers and publishes it as
// the fleet keep list's cluster key (wire.go); every agent of the cluster
// merges that key with the operator's own. Nothing here talks to the API
// server or to NATS, and time is an argument.
package declared

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Workload names one object that declares images: its kind, namespace and
// name.
type Workload struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// String is Kind/Namespace/Name (Kind/Name for a cluster-scoped object),
// as `gcagent ctl keep` and plan's reasons show it.
func (w Workload) String() string {
	if w.Namespace == "" {
		return w.Kind + "/" + w.Name
	}
	return w.Kind + "/" + w.Namespace + "/" + w.Name
}

func (w Workload) compare(o Workload) int {
	return cmp.Or(strings.Compare(w.Kind, o.Kind), strings.Compare(w.Namespace, o.Namespace), strings.Compare(w.Name, o.Name))
}

// Entry is one image of the list.
type Entry struct {
	// Image is the normalized reference (Normalize), a keep pattern that
	// covers exactly that image.
	Image string
	// By are the workloads that name it now, sorted; empty while it is
	// released.
	By []Workload
	// Undeclared is when the last workload stopped naming it; zero while
	// one does.
	Undeclared time.Time
}

// Set is the declared images and who declares them. It is a pure value:
// the caller owns it and serialises its use.
type Set struct {
	byWorkload map[Workload][]string
	images     map[string]*image
}

type image struct {
	by         map[Workload]struct{}
	undeclared time.Time // zero while declared
}

// NewSet returns an empty Set.
func NewSet() *Set {
	return &Set{byWorkload: map[Workload][]string{}, images: map[string]*image{}}
}

// Put records that w names images now (normalized references; duplicates
// are fine), replacing what it named before. An image no workload names
// any more is undeclared from now. It reports whether the list changed.
func (s *Set) Put(w Workload, images []string, now time.Time) bool {
	images = slices.Clone(images)
	slices.Sort(images)
	images = slices.Compact(images)
	old := s.byWorkload[w]
	if slices.Equal(old, images) {
		return false
	}
	for _, ref := range old {
		if _, found := slices.BinarySearch(images, ref); !found {
			s.drop(ref, w, now)
		}
	}
	for _, ref := range images {
		im := s.images[ref]
		if im == nil {
			im = &image{by: map[Workload]struct{}{}}
			s.images[ref] = im
		}
		im.by[w] = struct{}{}
		im.undeclared = time.Time{}
	}
	if len(images) == 0 {
		delete(s.byWorkload, w)
	} else {
		s.byWorkload[w] = images
	}
	return true
}

// Delete records that w is gone: Put with no images.
func (s *Set) Delete(w Workload, now time.Time) bool { return s.Put(w, nil, now) }

func (s *Set) drop(ref string, w Workload, now time.Time) {
	im := s.images[ref]
	if im == nil {
		return
	}
	delete(im.by, w)
	if len(im.by) == 0 && im.undeclared.IsZero() {
		im.undeclared = now
	}
}

// Seed adds an image the list held before this Set was built (the list a
// previous leader published), undeclared since then (zero: since now). An
// image some workload names is left as it is: Seed never shortens a grace.
func (s *Set) Seed(ref string, undeclared, now time.Time) {
	if undeclared.IsZero() || undeclared.After(now) {
		undeclared = now
	}
	im := s.images[ref]
	switch {
	case im == nil:
		s.images[ref] = &image{by: map[Workload]struct{}{}, undeclared: undeclared}
	case len(im.by) == 0 && undeclared.Before(im.undeclared):
		im.undeclared = undeclared
	}
}

// Release drops the images undeclared for grace or longer and returns
// them, and when the next one will be due (zero: none is waiting).
func (s *Set) Release(now time.Time, grace time.Duration) (released []string, next time.Time) {
	for ref, im := range s.images {
		if len(im.by) > 0 {
			continue
		}
		due := im.undeclared.Add(grace)
		if !now.Before(due) {
			released = append(released, ref)
			delete(s.images, ref)
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	slices.Sort(released)
	return released, next
}

// Len returns how many images the list holds, released ones waiting
// included, and how many workloads declare images.
func (s *Set) Len() (images, workloads int) { return len(s.images), len(s.byWorkload) }

// Entries returns the list, sorted by image.
func (s *Set) Entries() []Entry {
	out := make([]Entry, 0, len(s.images))
	for ref, im := range s.images {
		e := Entry{Image: ref, Undeclared: im.undeclared}
		for w := range im.by {
			e.By = append(e.By, w)
		}
		slices.SortFunc(e.By, Workload.compare)
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Image, b.Image) })
	return out
}
