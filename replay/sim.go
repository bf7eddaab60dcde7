package replay

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/trace"
)

// key is an image: its namespace and target digest.
type key struct{ ns, digest string }

// realImage is what the trace says of an image present on the real node.
type realImage struct {
	names  []string
	size   int64
	pinned bool
}

// sim is one replay. The simulated node is a projection per namespace
// (projection.State, fed the events the records stand for), planned by
// gc.PlanImages at the instants the agent would plan; its disk is the
// real one as last measured plus what the simulated node holds that the
// real one does not, minus the reverse (delta), each image counted at its
// footprint (footprints).
type sim struct {
	o        Options
	recorded *trace.Policy  // the policy the trace recorded last
	policy   gc.ImagePolicy // the policy replayed now
	order    *gdsf          // nil: least recently used first

	states map[string]*projection.State
	list   []*projection.State // states, sorted by namespace
	real   map[key]*realImage
	fp     map[key]int64 // footprints measured by the trace's deletions
	ratio  float64       // footprint per byte of size of the others
	delta  int64         // bytes the simulated node holds beyond the real one
	size   map[key]int64 // the last size the trace gave each image

	obs    trace.Disk // the real disk, as last measured
	hasObs bool

	episode      bool      // threshold GC goes on down to the low threshold
	above        bool      // the last evaluation found usage at or above high
	dirty        bool      // a record since the last pass may have made a candidate
	nextAgeOut   time.Time // the next max-age deadline; zero: none
	nextEligible time.Time // during a short episode: the next image to pass the minimum age

	from, to time.Time
	n        int
	rec, rep side
	// dryRun is how long the recorded policy was a dry run (the agent
	// deleted nothing), dryFrom when the current one began (zero: none);
	// last is the time of the record before the one replayed now.
	dryRun     time.Duration
	dryFrom    time.Time
	last, this time.Time
}

func newSim(recs []trace.Record, o Options) *sim {
	if o.Policy == nil {
		o.Policy = func(p *trace.Policy) gc.ImagePolicy {
			if p == nil {
				return DefaultPolicy()
			}
			return PolicyOf(*p)
		}
	}
	s := &sim{o: o, states: map[string]*projection.State{}, real: map[key]*realImage{}, size: map[key]int64{}}
	s.rec.pending, s.rep.pending = map[key]int{}, map[key]int{}
	s.rec.price = o.PullCost.orDefault()
	s.rep.price = s.rec.price
	s.fp, s.ratio = footprints(recs)
	switch o.Order {
	case OrderGDSF:
		// C in seconds of pull time over S in bytes freed.
		s.order = newGDSF(func(k key) float64 {
			var names []string
			if ri := s.real[k]; ri != nil {
				names = ri.names
			}
			return s.rep.price.Of(names, s.size[k]).Seconds() / float64(max(s.footprint(k), 1))
		})
	case OrderGDSFBytes:
		s.order = newGDSF(func(k key) float64 {
			if n := s.size[k]; n > 0 {
				return float64(n) / float64(max(s.footprint(k), 1))
			}
			return 1 / s.ratio
		})
	}
	s.setPolicy(nil)
	if len(recs) > 0 {
		s.from, s.to, s.n = recs[0].T, recs[len(recs)-1].T, len(recs)
	}
	return s
}

// footprints returns the bytes each image's delete freed, as the trace
// measured them (the agent measures the filesystem after each delete), and
// the ratio of those bytes to the images' sizes, which estimates the
// footprint of the images the trace never saw deleted: content and
// unpacked snapshots take more than the size the kubelet counts.
func footprints(recs []trace.Record) (map[key]int64, float64) {
	fp := map[key]int64{}
	var freed, size int64
	for _, r := range recs {
		if r.Ev == trace.KindRemoved && r.By == trace.ByAgent && r.Freed > 0 && r.Size > 0 {
			fp[key{r.NS, r.Digest}] = r.Freed
			freed += r.Freed
			size += r.Size
		}
	}
	if size == 0 {
		return fp, 1
	}
	return fp, float64(freed) / float64(size)
}

func (s *sim) footprint(k key) int64 {
	if n, ok := s.fp[k]; ok {
		return n
	}
	return int64(float64(s.size[k]) * s.ratio)
}

func (s *sim) setPolicy(p *trace.Policy) {
	s.recorded = p
	s.policy = s.o.Policy(p)
	if s.order != nil {
		s.policy.Order = s.order
	}
	s.rec.high = DefaultPolicy().HighThresholdPercent
	if p != nil {
		s.rec.high = p.High
	}
	s.rep.high = s.policy.HighThresholdPercent
}

// dryRunUntil counts the time up to t a dry run recorded; on says whether
// the policy from t on is one.
func (s *sim) dryRunUntil(t time.Time, on bool) {
	if !s.dryFrom.IsZero() {
		s.dryRun += max(t.Sub(s.dryFrom), 0)
		s.dryFrom = time.Time{}
	}
	if on {
		s.dryFrom = t
	}
}

// state returns namespace ns's simulated projection.
func (s *sim) state(ns string) *projection.State {
	st := s.states[ns]
	if st == nil {
		st = projection.New()
		st.Namespace = ns
		s.states[ns] = st
		s.list = slices.SortedFunc(maps.Values(s.states), func(a, b *projection.State) int { return cmp.Compare(a.Namespace, b.Namespace) })
	}
	return st
}

// record replays one record: first the deadlines before it, then what it
// says, then the triggers it may fire.
func (s *sim) record(r trace.Record) {
	s.last, s.this = s.this, r.T
	s.advance(r.T)
	k := key{r.NS, r.Digest}
	switch r.Ev {
	case trace.KindImage:
		s.image(r, k)
	case trace.KindUse:
		s.use(r, k)
	case trace.KindIdle:
		s.idle(r, k)
	case trace.KindRemoved:
		s.removed(r, k)
	case trace.KindDisk:
		if r.Disk == nil {
			return
		}
		s.account(r.T)
		s.obs, s.hasObs = *r.Disk, true
		if r.Trigger != "" {
			s.rec.passSeen = false
		}
		s.sample(r.T)
	case trace.KindStart:
		// An agent starts: the last one's dry run, if any, ended by its
		// last record (the time between is no agent's).
		s.dryRunUntil(s.last, false)
	case trace.KindPolicy:
		if r.Policy != nil {
			p := *r.Policy
			s.dryRunUntil(r.T, p.DryRun)
			s.setPolicy(&p)
			s.dirty = true
		}
	}
	s.evaluate(r.T)
}

// advance runs the passes whose deadlines (max age; the minimum age,
// during an episode) come before t.
func (s *sim) advance(t time.Time) {
	for {
		d, trigger := s.nextAgeOut, "max-age"
		if s.episode && !s.nextEligible.IsZero() && (d.IsZero() || s.nextEligible.Before(d)) {
			d, trigger = s.nextEligible, "min-age"
		}
		if d.IsZero() || d.After(t) {
			return
		}
		s.pass(d, trigger)
		if !s.nextAgeOut.After(d) && trigger == "max-age" {
			s.nextAgeOut = time.Time{}
		}
		if !s.nextEligible.After(d) && trigger == "min-age" {
			s.nextEligible = time.Time{}
		}
	}
}

// evaluate decides, as the agent's trigger does on each disk sample and
// state change, whether a pass runs at t: when usage reaches the high
// threshold, and during the episode that follows (until usage is at the
// low threshold) whenever a record may have made a candidate.
func (s *sim) evaluate(t time.Time) {
	if !s.hasObs {
		return
	}
	p := s.policy
	d := s.simDisk()
	u := d.Usage()
	above := (p.HighThresholdPercent < 100 || p.MaxAge > 0) && u >= p.HighThresholdPercent
	crossed := above && !s.above
	s.above = above
	switch {
	case !s.episode && above:
		s.episode = true
		s.pass(t, "disk")
	case !s.episode:
	case lowReached(d, p.LowThresholdPercent):
		s.endEpisode()
	case crossed:
		s.pass(t, "disk")
	case s.dirty:
		trigger := "episode"
		if above {
			trigger = "change"
		}
		s.pass(t, trigger)
	}
}

func (s *sim) endEpisode() {
	s.episode, s.nextEligible = false, time.Time{}
}

// pass is one image GC pass at t, as the agent's: plan with the real
// planner (during an episode, down to the low threshold), then delete in
// the plan's order, the images it named and, while the disk is still
// above the low threshold, the others it would take next, stopping at the
// low threshold.
func (s *sim) pass(t time.Time, trigger string) {
	p := s.policy
	pp := p
	if s.episode && p.LowThresholdPercent < p.HighThresholdPercent {
		pp.HighThresholdPercent = p.LowThresholdPercent
	}
	plan := gc.PlanImages(s.list, gcDisk(s.simDisk(), s.hasObs), pp, t)
	queue, planned := plan.Delete, len(plan.Delete)
	if plan.Triggered {
		queue = slices.Clone(queue)
		for _, it := range plan.Keep {
			if it.Reason == gc.ReasonNotNeeded {
				queue = append(queue, it)
			}
		}
		if s.order != nil {
			slices.SortStableFunc(queue[planned:], func(a, b gc.ImageItem) int {
				return cmp.Compare(s.order.Rank(&a), s.order.Rank(&b))
			})
		}
	}
	removed := 0
	for i, it := range queue {
		rule := it.Reason
		if i >= planned {
			rule = gc.ReasonSpace
		}
		if rule == gc.ReasonSpace && s.hasObs && lowReached(s.simDisk(), p.LowThresholdPercent) {
			continue
		}
		s.delete(it, t, string(rule), trigger)
		removed++
	}
	if removed > 0 {
		s.rep.out.Passes++
	}
	s.dirty = false
	s.nextAgeOut = plan.NextAgeOut
	s.nextEligible = time.Time{}
	d := s.simDisk()
	if s.hasObs && lowReached(d, p.LowThresholdPercent) && d.Usage() < p.HighThresholdPercent {
		s.endEpisode()
		s.above = false
	} else if plan.Triggered {
		for _, it := range plan.Keep {
			if it.Reason == gc.ReasonTooYoung && it.EligibleAt.After(t) &&
				(s.nextEligible.IsZero() || it.EligibleAt.Before(s.nextEligible)) {
				s.nextEligible = it.EligibleAt
			}
		}
	}
}

// delete is the simulated image GC deleting it at t.
func (s *sim) delete(it gc.ImageItem, t time.Time, rule, trigger string) {
	k := key{it.Namespace, it.Digest}
	s.account(t)
	s.drop(s.state(it.Namespace), k, t)
	s.delta -= s.footprint(k)
	s.sample(t)
	s.rep.deleted(k, Deletion{T: t, Namespace: it.Namespace, Digest: it.Digest, Names: it.Names, Size: it.Size,
		Rule: rule, Trigger: trigger})
	if s.order != nil {
		s.order.evict(k)
	}
}

// image: an image arrived on the real node, or its names, size or pin
// changed. The simulated node gets it too: at once if it is new there
// (a re-pull when its image GC had deleted it), or, if it deleted the
// image while the real node kept it, when a name is added (a pull).
func (s *sim) image(r trace.Record, k key) {
	ri := s.real[k]
	arrival := ri == nil
	if arrival {
		ri = &realImage{size: s.size[k]}
		s.real[k] = ri
	}
	added := slices.ContainsFunc(r.Names, func(n string) bool { return !slices.Contains(ri.names, n) })
	ri.names, ri.pinned = r.Names, r.Pinned
	if r.Size > 0 {
		ri.size = r.Size
		s.size[k] = r.Size
	}
	st := s.state(r.NS)
	has := st.Images[r.Digest] != nil
	firstSeen := cmp.Or(r.FirstSeen, r.T)
	if arrival {
		s.account(r.T)
		s.delta -= s.footprint(k)
		s.rec.returned(k, r.T)
		if !has {
			s.bring(st, k, firstSeen, r.T)
			if used := cmp.Or(r.LastUsed, firstSeen); r.Used {
				st.Apply(events.ContainerUpserted{At: used, ID: cid(k), Image: ri.names[0], ImageDigest: k.digest})
			} else if !r.LastUsed.IsZero() {
				st.Apply(events.ContainerUpserted{At: used, ID: cid(k), Image: ri.names[0], ImageDigest: k.digest})
				st.Apply(events.ContainerDeleted{At: used, ID: cid(k)})
			}
		}
		s.sample(r.T)
	}
	switch {
	case has:
		s.sync(st, k, r.T)
	case arrival: // brought above
	case added:
		s.bring(st, k, r.T, r.T)
	}
	s.dirty = true
	if p := s.policy; p.MaxAge > 0 {
		earliest(&s.nextAgeOut, firstSeen.Add(p.MaxAge+time.Nanosecond))
	}
	if s.episode && s.policy.MinAge > 0 && arrival {
		earliest(&s.nextEligible, firstSeen.Add(s.policy.MinAge))
	}
}

// bring puts the real node's image k on the simulated node at t (first
// seen then): a re-pull when the simulated image GC had deleted it.
func (s *sim) bring(st *projection.State, k key, firstSeen, t time.Time) {
	s.account(t)
	s.rep.returned(k, t)
	s.delta += s.footprint(k)
	s.sample(t)
	ri := s.real[k]
	for _, n := range ri.names {
		st.Apply(s.upsert(k, n, firstSeen))
	}
	if s.order != nil {
		s.order.arrive(k)
	}
}

// sync gives the simulated image k the real one's names, size and pin.
func (s *sim) sync(st *projection.State, k key, t time.Time) {
	ri, img := s.real[k], st.Images[k.digest]
	for _, n := range img.Names.Strings() {
		if !slices.Contains(ri.names, n) {
			st.Apply(events.ImageDeleted{At: t, Name: n})
		}
	}
	for _, n := range ri.names {
		st.Apply(s.upsert(k, n, t))
	}
}

func (s *sim) upsert(k key, name string, t time.Time) events.ImageUpserted {
	ri := s.real[k]
	e := events.ImageUpserted{At: t, Name: name, Digest: k.digest, Size: ri.size}
	if ri.pinned {
		e.Labels = pinnedLabels
	}
	return e
}

var pinnedLabels = map[string]string{projection.LabelPinned: projection.LabelPinnedValue}

// drop removes image k from the simulated node.
func (s *sim) drop(st *projection.State, k key, t time.Time) {
	if img := st.Images[k.digest]; img != nil {
		for _, n := range img.Names.Strings() {
			st.Apply(events.ImageDeleted{At: t, Name: n})
		}
	}
}

// cid is the one container that stands for every container holding
// image k on the real node.
func cid(k key) string { return "replay:" + k.digest }

// use: a container on the real node started holding image k. The
// simulated node must have it: if its image GC deleted it, that is a
// re-pull.
func (s *sim) use(r trace.Record, k key) {
	ri := s.real[k]
	if ri == nil || len(ri.names) == 0 {
		return // an image the trace never saw arrive
	}
	st := s.state(k.ns)
	if st.Images[k.digest] == nil {
		s.bring(st, k, r.T, r.T)
	}
	st.Apply(events.ContainerUpserted{At: r.T, ID: cid(k), Image: ri.names[0], ImageDigest: k.digest})
	if s.order != nil {
		s.order.use(k)
	}
}

// idle: the last container holding image k on the real node went.
func (s *sim) idle(r trace.Record, k key) {
	st := s.state(k.ns)
	if st.Containers[cid(k)] == nil {
		return
	}
	st.Apply(events.ContainerDeleted{At: r.T, ID: cid(k)})
	s.dirty = true
	if p := s.policy; p.MaxAge > 0 {
		earliest(&s.nextAgeOut, r.T.Add(p.MaxAge+time.Nanosecond))
	}
	if s.order != nil {
		s.order.idle(k)
	}
}

// removed: image k left the real node. The agent's image GC removed it
// (the bytes it freed were measured: the real disk is known right after)
// or someone else did, and then the simulated node loses it too.
func (s *sim) removed(r trace.Record, k key) {
	if s.real[k] == nil {
		return
	}
	s.account(r.T)
	s.delta += s.footprint(k)
	st := s.state(k.ns)
	if r.By == trace.ByAgent {
		if s.hasObs {
			s.obs.Available = min(s.obs.Available+uint64(max(r.Freed, 0)), s.obs.Capacity)
		}
		if !s.rec.passSeen {
			s.rec.passSeen = true
			s.rec.out.Passes++
		}
		s.rec.deleted(k, Deletion{T: r.T, Namespace: k.ns, Digest: k.digest, Names: s.real[k].names, Size: s.real[k].size,
			Rule: r.Rule, Trigger: r.Trigger})
	} else if st.Images[k.digest] != nil {
		s.drop(st, k, r.T)
		s.delta -= s.footprint(k)
		if st.Containers[cid(k)] != nil {
			st.Apply(events.ContainerDeleted{At: r.T, ID: cid(k)})
		}
		if s.order != nil {
			s.order.forget(k)
		}
	}
	delete(s.real, k)
	s.sample(r.T)
}
