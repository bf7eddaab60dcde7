package projection

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
)

// SpacesOptions configures Spaces.
type SpacesOptions struct {
	// Store is the file every namespace's projection is persisted in (each
	// in its own buckets, Store.Space); nil keeps them in memory only.
	Store *Store
	// Live is the template of each namespace's Live; its Namespace, Store
	// and Registerer are ignored.
	Live LiveOptions
	// Managed says which namespaces a restored file may bring back; nil:
	// all. A namespace no longer managed keeps its buckets, unused.
	Managed    func(ns string) bool
	Registerer prometheus.Registerer
	// GatherWindow is how long Run's batch waits, after its first event,
	// for more: a batch is journaled in one transaction with one fsync
	// (group commit), so a busy node's churn pays one per window, not one
	// per event. It is also the most an event waits before the projection
	// shows it. Default DefaultGatherWindow.
	GatherWindow time.Duration
	// AfterRound, if set, is called by Run after it applied a batch with a
	// Round (every namespace listed); Run waits for it. The listing that
	// came before is garbage then: the most the agent ever frees at once.
	AfterRound func()
}

// DefaultGatherWindow is SpacesOptions.GatherWindow's default.
const DefaultGatherWindow = 5 * time.Millisecond

// Spaces is the projection of every managed containerd namespace: one Live
// per namespace, persisted in one file, fed by the one event stream of the
// Source (events.Scoped). A namespace gets its Live with its first event
// and loses it (and its buckets) when a Round no longer lists it. Its
// methods are safe for concurrent use; only Run (or Apply) mutates.
type Spaces struct {
	o SpacesOptions
	m *liveMetrics

	mu    sync.RWMutex
	lives map[string]*Live
	round bool // a Round was applied: every managed namespace was listed
	subs  subscribers
}

// NewSpaces restores every managed namespace's projection from the store,
// unsynced until the Source's first Round.
func NewSpaces(o SpacesOptions) (*Spaces, error) {
	if o.Managed == nil {
		o.Managed = func(string) bool { return true }
	}
	if o.GatherWindow <= 0 {
		o.GatherWindow = DefaultGatherWindow
	}
	s := &Spaces{o: o, m: newLiveMetrics(), lives: map[string]*Live{}}
	s.m.register(o.Registerer, s.all)
	if o.Store == nil {
		return s, nil
	}
	names, err := o.Store.Spaces()
	if err != nil {
		return nil, err
	}
	for _, ns := range names {
		if !o.Managed(ns) {
			continue
		}
		if _, err := s.open(ns); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// open returns namespace ns's Live, restoring or creating it.
func (s *Spaces) open(ns string) (*Live, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lives[ns]; l != nil {
		return l, nil
	}
	opts := s.o.Live
	opts.Namespace, opts.Registerer, opts.metrics, opts.Store = ns, nil, s.m, nil
	if s.o.Store != nil {
		opts.Store = s.o.Store.Space(ns)
	}
	l, err := NewLive(opts)
	if err != nil {
		return nil, err
	}
	s.lives[ns] = l
	return l, nil
}

// all returns every namespace's Live, sorted by namespace.
func (s *Spaces) all() []*Live {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Live, 0, len(s.lives))
	for _, ns := range slices.Sorted(maps.Keys(s.lives)) {
		out = append(out, s.lives[ns])
	}
	return out
}

// Names returns the namespaces with a projection, sorted.
func (s *Spaces) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Sorted(maps.Keys(s.lives))
}

// Live returns namespace ns's projection, nil if it has none (yet).
func (s *Spaces) Live(ns string) *Live {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lives[ns]
}

// Run applies events from in until ctx ends, then writes a final snapshot
// of every namespace. Events that arrive within GatherWindow of a batch's
// first (at most maxBatch) are applied and journaled as one batch. While
// writes fail, snapshots are retried every second.
func (s *Spaces) Run(ctx context.Context, in <-chan events.Scoped) error {
	var retry <-chan time.Time
	gather := time.NewTimer(s.o.GatherWindow)
	gather.Stop()
	for {
		if retry == nil && s.JournalFault() != nil {
			retry = time.After(snapshotRetry)
		}
		select {
		case <-ctx.Done():
			for _, l := range s.all() {
				l.snapshot()
			}
			return nil
		case <-retry:
			retry = nil
			for _, l := range s.all() {
				if l.fault.Load() != nil {
					l.snapshot()
				}
			}
		case ev := <-in:
			batch := []events.Scoped{ev}
			gather.Reset(s.o.GatherWindow)
		drain:
			for len(batch) < maxBatch {
				select {
				case ev := <-in:
					batch = append(batch, ev)
				case <-gather.C:
					break drain
				case <-ctx.Done():
					break drain
				}
			}
			gather.Stop()
			round := slices.ContainsFunc(batch, isRound)
			s.Apply(batch...)
			if round && s.o.AfterRound != nil {
				s.o.AfterRound()
			}
		}
	}
}

// maxBatch bounds a batch (and the memory it holds) when events come
// faster than one window.
const maxBatch = 512

// Apply folds a batch into the namespaces' projections, each namespace's
// events in order and journaled together, and notifies subscribers once.
// A Round applies after the events before it. A Listing is cleared from
// batch once reconciled (see Live.Apply).
func (s *Spaces) Apply(batch ...events.Scoped) {
	for len(batch) > 0 {
		i := slices.IndexFunc(batch, isRound)
		if i < 0 {
			i = len(batch)
		}
		s.applyRun(batch[:i])
		if i < len(batch) {
			s.applyRound(batch[i].Event.(events.Round))
			i++
		}
		batch = batch[i:]
	}
	s.notify()
}

func isRound(e events.Scoped) bool { return e.Event != nil && e.Event.Kind() == events.KindRound }

// applyRun applies run, a batch without a Round, each namespace's events
// together; a Listing is cleared from run (see Live.Apply).
func (s *Spaces) applyRun(run []events.Scoped) {
	var order []string
	byNS := map[string][]events.Event{}
	for i, e := range run {
		if _, ok := byNS[e.Namespace]; !ok {
			order = append(order, e.Namespace)
		}
		byNS[e.Namespace] = append(byNS[e.Namespace], e.Event)
		if _, ok := e.Event.(events.Listing); ok {
			run[i].Event = nil // byNS holds it until Live.Apply lets it go
		}
	}
	for _, ns := range order {
		l, err := s.open(ns)
		if err != nil {
			// Only a restore can fail, and a namespace met in the stream has
			// nothing to restore; the next listing retries.
			s.m.journalErrors.Inc()
			s.o.Live.Log.Error().Err(err).Str("namespace", ns).Msg("projection not opened; events dropped")
			continue
		}
		l.Apply(byNS[ns]...)
	}
}

// applyRound forgets the namespaces a Round does not list: they were
// deleted (containerd deletes only empty ones) or are no longer managed.
func (s *Spaces) applyRound(r events.Round) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ns, l := range s.lives {
		if slices.Contains(r.Namespaces, ns) {
			continue
		}
		delete(s.lives, ns)
		if l.opts.Store != nil {
			if err := l.opts.Store.Drop(); err != nil {
				s.m.journalErrors.Inc()
				s.o.Live.Log.Error().Err(err).Str("namespace", ns).Msg("projection of a gone namespace not dropped")
			}
		}
		s.o.Live.Log.Info().Str("namespace", ns).Msg("namespace gone: projection dropped")
	}
	s.round = true
}

// View calls fn with each namespace's state in turn (sorted by namespace),
// each under its own read lock; fn must not keep or modify it.
func (s *Spaces) View(fn func(*State)) {
	for _, l := range s.all() {
		l.View(fn)
	}
}

// ViewAll calls fn with every namespace's state at once (sorted by
// namespace), all read-locked; fn must not keep or modify them.
func (s *Spaces) ViewAll(fn func([]*State)) {
	lives := s.all()
	states := make([]*State, len(lives))
	for i, l := range lives {
		l.mu.RLock()
		defer l.mu.RUnlock()
		states[i] = l.state
	}
	fn(states)
}

// SeqOf is a change counter of states together (those of ViewAll): it
// moves whenever one of them applies an event.
func SeqOf(states []*State) (seq uint64) {
	for _, s := range states {
		seq += s.Seq
	}
	return seq
}

// Synced reports whether every managed namespace was listed since the
// agent started: nothing may be deleted before.
func (s *Spaces) Synced() bool {
	s.mu.RLock()
	round := s.round
	s.mu.RUnlock()
	if !round {
		return false
	}
	for _, l := range s.all() {
		if !l.Synced() {
			return false
		}
	}
	return true
}

// FlushTrace writes every namespace's pending trace records (Live.FlushTrace).
func (s *Spaces) FlushTrace() error {
	var errs []error
	for _, l := range s.all() {
		errs = append(errs, l.FlushTrace())
	}
	return errors.Join(errs...)
}

// JournalFault returns the first namespace's persistence failure, nil when
// every last write succeeded.
func (s *Spaces) JournalFault() *JournalFault {
	for _, l := range s.all() {
		if f := l.JournalFault(); f != nil {
			return f
		}
	}
	return nil
}

// Subscribe returns a channel that receives a signal after each applied
// batch (see subscribers). Call before Run starts.
func (s *Spaces) Subscribe() <-chan struct{} { return s.subs.add() }

func (s *Spaces) notify() { s.subs.notify() }

// In returns namespace ns's projection as one-namespace readers (the log
// cleaner, CRI's namespace) see it, whether or not it exists yet.
func (s *Spaces) In(ns string) Namespace {
	return Namespace{s: s, ns: ns}
}

// Namespace is one namespace's projection inside Spaces.
type Namespace struct {
	s  *Spaces
	ns string
}

// View calls fn with the namespace's state, or an empty unsynced one when
// it has none.
func (n Namespace) View(fn func(*State)) {
	if l := n.s.Live(n.ns); l != nil {
		l.View(fn)
		return
	}
	empty := New()
	empty.Namespace = n.ns
	fn(empty)
}
