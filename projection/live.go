package projection

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// LiveOptions configures a Live projection.
type LiveOptions struct {
	// Namespace is the containerd namespace projected. Default k8s.io.
	Namespace string
	// Store persists the projection; nil keeps it in memory only.
	Store *Store
	// SnapshotEvery is how many journal entries trigger a snapshot (and so a
	// compaction). Default 4096.
	SnapshotEvery int
	// PodHistory is how long a gone pod is remembered (for pod log grace).
	// Default 24h.
	PodHistory time.Duration
	// Now is the clock; default time.Now.
	Now        func() time.Time
	Log        zerolog.Logger
	Registerer prometheus.Registerer

	// metrics, when set by Spaces, are shared by every namespace's Live
	// (and registered once); else NewLive makes and registers its own.
	metrics *liveMetrics
}

// Live owns one namespace's State: it applies events, journals them, takes
// snapshots, and hands out copies. Its methods are safe for concurrent
// use; only Apply mutates, called by one goroutine (Spaces.Run's).
type Live struct {
	opts  LiveOptions
	mu    sync.RWMutex
	state *State
	subs  subscribers
	since int // journal entries since the last snapshot
	m     *liveMetrics
	fault atomic.Pointer[JournalFault] // nil while persisting works
	tried time.Time                    // last snapshot attempt; the applying goroutine only
	// tr derives the usage trace when the store keeps one; the applying
	// goroutine only, under mu.
	tr *tracer
}

// snapshotRetry spaces snapshot attempts while writes fail: each encodes the
// whole state, and on a full disk every batch would otherwise try one.
const snapshotRetry = time.Second

// JournalFault describes a failure to persist the projection (a full or
// broken state disk) that has not yet been repaired by a later write.
type JournalFault struct {
	Err      string    // the last error
	Since    time.Time // the first failure of this run of failures
	Failures int       // failed appends and snapshots since then
}

// JournalFault returns the current persistence failure, or nil when the
// last write to the store succeeded. Safe for concurrent use.
func (l *Live) JournalFault() *JournalFault { return l.fault.Load() }

// failed records a failed write; only the applying goroutine writes.
func (l *Live) failed(err error) {
	l.m.journalErrors.Inc()
	f := JournalFault{Err: err.Error(), Since: l.opts.Now(), Failures: 1}
	if old := l.fault.Load(); old != nil {
		f.Since, f.Failures = old.Since, old.Failures+1
	}
	l.fault.Store(&f)
}

type liveMetrics struct {
	applied       *prometheus.CounterVec
	journalErrors prometheus.Counter
	snapshots     prometheus.Counter
}

func newLiveMetrics() *liveMetrics {
	return &liveMetrics{
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_projection_events_applied_total", Help: "Domain events applied to the projection, by namespace and kind.",
		}, []string{"namespace", "kind"}),
		journalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_projection_journal_errors_total", Help: "Journal appends, snapshots or entries that failed.",
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_projection_snapshots_total", Help: "Snapshots written (each compacts the journal).",
		}),
	}
}

// register registers the metrics and the gauges of the projections lives
// returns at scrape time.
func (m *liveMetrics) register(reg prometheus.Registerer, lives func() []*Live) {
	if reg != nil {
		reg.MustRegister(m.applied, m.journalErrors, m.snapshots, gaugeFunc{lives})
	}
}

// NewLive restores the projection from the store (snapshot plus journal),
// unsynced until the first reconcile.
func NewLive(opts LiveOptions) (*Live, error) {
	opts.Log = opts.Log.With().Str("namespace", opts.Namespace).Logger()
	if opts.SnapshotEvery <= 0 {
		opts.SnapshotEvery = 4096
	}
	if opts.PodHistory <= 0 {
		opts.PodHistory = 24 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Namespace == "" {
		opts.Namespace = events.CRINamespace
	}
	l := &Live{opts: opts, state: New(), m: opts.metrics}
	var restored *tracer
	if l.m == nil {
		l.m = newLiveMetrics()
		l.m.register(opts.Registerer, func() []*Live { return []*Live{l} })
	}
	if opts.Store != nil {
		res, err := opts.Store.Load()
		if err != nil {
			return nil, err
		}
		for _, err := range res.Skipped {
			l.m.journalErrors.Inc()
			opts.Log.Error().Err(err).Msg("journal entry skipped")
		}
		l.state = res.State
		l.since = res.Replayed
		restored = res.tracer
		opts.Log.Info().Int("images", len(l.state.Images)).Int("containers", len(l.state.Containers)).
			Int("pods", len(l.state.Pods)).Int("replayed", res.Replayed).Uint64("seq", l.state.Seq).Msg("projection restored")
	}
	l.state.Namespace = opts.Namespace
	l.startTrace(restored)
	for _, k := range events.Kinds { // the namespace's series exist at zero from its first sight
		l.m.applied.WithLabelValues(opts.Namespace, string(k))
	}
	return l, nil
}

// Namespace is the containerd namespace projected.
func (l *Live) Namespace() string { return l.opts.Namespace }

// Apply folds events (a Listing through Reconcile) into the state, journals
// what was applied (before readers can see it) and notifies subscribers.
// A Listing in batch is cleared from it once reconciled: a busy node's
// listing is the largest piece of memory the agent holds, and it is not
// kept while the state is journaled. Spaces.Run calls it; tests and tools
// may call it when nothing else does.
func (l *Live) Apply(batch ...events.Event) {
	var applied []events.Event
	l.mu.Lock()
	for i, ev := range batch {
		evs := []events.Event{ev}
		if listing, ok := ev.(events.Listing); ok {
			evs = Reconcile(l.state, listing)
			batch[i] = nil
		}
		for _, e := range evs {
			l.state.Apply(e)
			if l.tr != nil {
				l.tr.observe(l.state, e)
			}
			l.m.applied.WithLabelValues(l.opts.Namespace, string(e.Kind())).Inc()
		}
		applied = append(applied, evs...)
	}
	n := len(applied)
	// The batch is journaled before the lock is released: nobody (GC,
	// /status, control replies) sees a state that a kill -9 would lose, such
	// as the first-seen time of an image, short of a failed write.
	// A batch as large as a snapshot's worth of journal (a first listing
	// of a big node) is written as a snapshot: one encoding of the state
	// instead of one entry per event and a snapshot right after.
	var appendErr error
	st := l.opts.Store
	asSnapshot := st != nil && n >= l.opts.SnapshotEvery
	var recs []trace.Record
	if l.tr != nil && (asSnapshot || l.tr.due(l.opts.Now())) {
		recs = l.tr.take()
	}
	if asSnapshot {
		applied = nil // their copy of the listing's facts is garbage now: the state holds its own
		l.tried = l.opts.Now()
		appendErr = st.Snapshot(l.state, recs...)
	} else if st != nil {
		appendErr = st.Append(l.state.Seq, applied, recs...)
	}
	if appendErr != nil && len(recs) > 0 {
		if n := l.tr.keep(recs); n > 0 {
			l.opts.Log.Warn().Int("records", n).Msg("usage trace: records dropped while the state file cannot be written")
		}
	}
	l.mu.Unlock()

	if st != nil {
		// A full disk must not stop the agent that frees it: the state in
		// memory stays right, and the next snapshot catches the file up.
		switch err := appendErr; {
		case err != nil:
			l.failed(err)
			l.opts.Log.Error().Err(err).Int("events", n).Msg("journal append failed")
			l.since = l.opts.SnapshotEvery // the journal has a gap: a snapshot covers it
		case asSnapshot:
			l.snapshotted()
		default:
			l.since += n
		}
		if l.since >= l.opts.SnapshotEvery && l.snapshotDue() {
			l.snapshot()
		} else if tl := st.Trace(); tl != nil && tl.CompactDue() {
			l.compactTrace()
		}
	}
	l.notify()
}

// startTrace derives the usage trace from here on when the store keeps
// one: going on from restored, the tracer that went through the restore's
// replay, or, for a trace that does not hold this namespace yet, from the
// images present now, which it records.
func (l *Live) startTrace(restored *tracer) {
	tl := l.opts.Store.Trace()
	if tl == nil {
		l.state.tracing = false
		return
	}
	if restored != nil && !tl.Fresh() {
		l.tr = restored
		return
	}
	l.tr = newTracer(l.state)
	if len(l.state.Images) == 0 {
		return
	}
	if err := l.opts.Store.PutTrace(l.state.Seq, l.tr.base(l.state, l.opts.Now())); err != nil {
		l.m.journalErrors.Inc()
		l.opts.Log.Error().Err(err).Msg("usage trace: the images present not recorded")
	}
}

// FlushTrace writes the trace records made so far (they otherwise wait
// for a thousand, a minute or a snapshot), so that a reader of the trace
// sees everything applied. Safe for concurrent use.
func (l *Live) FlushTrace() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tr == nil || len(l.tr.recs) == 0 {
		return nil
	}
	recs := l.tr.take()
	if err := l.opts.Store.PutTrace(l.state.Seq, recs); err != nil {
		l.tr.keep(recs)
		return err
	}
	return nil
}

// compactTrace merges and bounds the usage trace (trace.Log.Compact).
func (l *Live) compactTrace() {
	tl := l.opts.Store.Trace()
	if tl == nil {
		return
	}
	if err := tl.Compact(l.opts.Now()); err != nil {
		l.m.journalErrors.Inc()
		l.opts.Log.Error().Err(err).Msg("usage trace not compacted")
	}
}

// snapshotDue is false for a second after a failed attempt (a clock step
// backwards does not hold it off).
func (l *Live) snapshotDue() bool {
	if l.fault.Load() == nil {
		return true
	}
	d := l.opts.Now().Sub(l.tried)
	return d < 0 || d >= snapshotRetry
}

func (l *Live) snapshot() {
	st := l.opts.Store
	if st == nil {
		return
	}
	l.tried = l.opts.Now()
	l.mu.Lock()
	l.state.ForgetPodsGoneBefore(l.opts.Now().Add(-l.opts.PodHistory))
	l.state.ForgetDeletionsBefore(l.opts.Now())
	l.mu.Unlock()
	// Encoded in place, without a copy of the whole state: this goroutine
	// is the only writer, and readers share the read lock meanwhile.
	l.mu.RLock()
	var recs []trace.Record
	if l.tr != nil {
		recs = l.tr.take() // the tracer is this goroutine's
	}
	err := st.Snapshot(l.state, recs...)
	l.mu.RUnlock()
	if err != nil {
		if len(recs) > 0 {
			l.tr.keep(recs)
		}
		l.failed(err)
		l.opts.Log.Error().Err(err).Msg("snapshot failed")
		return
	}
	l.snapshotted()
	l.compactTrace()
}

// snapshotted records a snapshot written: the journal restarts empty, and
// a failure before it is repaired.
func (l *Live) snapshotted() {
	l.m.snapshots.Inc()
	l.since = 0
	if l.fault.Swap(nil) != nil {
		l.opts.Log.Info().Msg("journal resumed: snapshot written")
	}
}

// Snapshot returns a deep copy of the current state.
func (l *Live) Snapshot() *State {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.Clone()
}

// View calls fn with the current state under a read lock; fn must not keep
// or modify it.
func (l *Live) View(fn func(*State)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	fn(l.state)
}

// ViewAll calls fn with the one state, as Spaces.ViewAll does with every
// namespace's; fn must not keep or modify it.
func (l *Live) ViewAll(fn func([]*State)) {
	l.View(func(s *State) { fn([]*State{s}) })
}

// Synced reports whether the projection reflects a full listing of
// containerd since the agent started. Nothing may be deleted before.
func (l *Live) Synced() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.state.Synced
}

// Subscribe returns a channel that receives a signal after each applied
// batch (see subscribers). Call before events are applied.
func (l *Live) Subscribe() <-chan struct{} { return l.subs.add() }

func (l *Live) notify() { l.subs.notify() }

// subscribers are the channels of a projection's readers: each receives a
// signal after an applied batch; signals coalesce, so a slow reader never
// blocks the projection.
type subscribers []chan struct{}

func (s *subscribers) add() <-chan struct{} {
	ch := make(chan struct{}, 1)
	*s = append(*s, ch)
	return ch
}

func (s subscribers) notify() {
	for _, ch := range s {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// gaugeFunc exports the projections' sizes at scrape time.
type gaugeFunc struct{ lives func() []*Live }

var (
	descImages     = prometheus.NewDesc("gcagent_projection_images", "Images (target digests) in the projection, by namespace.", []string{"namespace"}, nil)
	descContainers = prometheus.NewDesc("gcagent_projection_containers", "Containers in the projection, by namespace and state.", []string{"namespace", "state"}, nil)
	descPods       = prometheus.NewDesc("gcagent_projection_live_pods", "Pods with a sandbox, by namespace.", []string{"namespace"}, nil)
	descSynced     = prometheus.NewDesc("gcagent_projection_synced", "1 once the namespace's projection reflects a full listing.", []string{"namespace"}, nil)
	descDeletions  = prometheus.NewDesc("gcagent_projection_regret_deletions", "Images this agent's image GC deleted whose regret window is still open (remembered to notice their return), by namespace.", []string{"namespace"}, nil)
)

func (g gaugeFunc) Describe(ch chan<- *prometheus.Desc) {
	ch <- descImages
	ch <- descContainers
	ch <- descPods
	ch <- descSynced
	ch <- descDeletions
}

func (g gaugeFunc) Collect(ch chan<- prometheus.Metric) {
	for _, l := range g.lives() {
		l.collect(ch)
	}
}

func (l *Live) collect(ch chan<- prometheus.Metric) {
	ns := l.opts.Namespace
	l.View(func(s *State) {
		ch <- prometheus.MustNewConstMetric(descImages, prometheus.GaugeValue, float64(len(s.Images)), ns)
		byState := map[ContainerState]int{StateCreated: 0, StateRunning: 0, StateExited: 0}
		for _, c := range s.Containers {
			byState[c.State]++
		}
		for st, n := range byState {
			ch <- prometheus.MustNewConstMetric(descContainers, prometheus.GaugeValue, float64(n), ns, st.String())
		}
		live := 0
		for _, p := range s.Pods {
			if p.Alive() {
				live++
			}
		}
		ch <- prometheus.MustNewConstMetric(descPods, prometheus.GaugeValue, float64(live), ns)
		ch <- prometheus.MustNewConstMetric(descDeletions, prometheus.GaugeValue, float64(len(s.Deletions)), ns)
		synced := 0.0
		if s.Synced {
			synced = 1
		}
		ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, synced, ns)
	})
}
