package gc

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/projection"
	"github.com/rs/zerolog"
)

// containerState is the projection as the container GC reads it: View
// calls fn with each namespace's state in turn (Synced is read inside View,
// with the state the plan is made from); projection.Spaces is the real
// one, projection.Live one of a single namespace.
type containerState interface {
	View(fn func(*projection.State))
}

var (
	_ containerState = (*projection.Live)(nil)
	_ containerState = (*projection.Spaces)(nil)
)

// ContainerGCOptions configures a ContainerGC; all but Policy are optional.
type ContainerGCOptions struct {
	// Policy must pass Validate.
	Policy  ContainerPolicy
	DryRun  bool
	Metrics *ContainerMetrics // nil: nothing recorded
	Log     zerolog.Logger    // the zero Logger logs nothing
	Clock   clock.Timers      // nil: the real clock
	// MaxRetry caps the backoff after failed deletes. Default 1m.
	MaxRetry time.Duration
	// MinGap spaces passes woken by projection changes: a change within
	// MinGap of the last pass waits for the gap's end, so a burst of events
	// (a node drained, a build farm) costs one pass per gap, not one per
	// event, while a lone change is planned at once. 0: a pass per change.
	MinGap time.Duration
}

// ContainerGCDeps are what a ContainerGC works through. State, Changes and
// Runtime are required; Deletes is, unless the GC is a dry run.
type ContainerGCDeps struct {
	// State is the projection (*projection.Spaces); Changes its
	// subscription (taken before it runs).
	State   containerState
	Changes <-chan struct{}
	// Runtime re-reads and deletes containers (the node adapter).
	Runtime containerRuntime
	// Deletes begins each delete's transaction (a *deletion.Manager).
	Deletes deleteLog
	// Publisher receives what is not a removal (a dry run's skips); nil:
	// nothing published.
	Publisher Publisher
	// PodLogDir is the pod log dir as the agent has seen it
	// (*logs.PodDirs): a pod with no sandbox ready whose log dir was seen
	// and went counts as deleted PodGrace after it went. nil: no pod counts
	// as deleted.
	PodLogDir PodLogDir
	// Logs removes a CRI container's log files and legacy link with it
	// (a *logs.ContainerLogs); nil: logs are left alone.
	Logs containerLogFiles
}

// ContainerGC removes dead containers as soon as the policy allows, without
// polling: it plans on every projection change (a task exit included) and
// keeps one timer armed at the plan's NextEligible, the instant the next
// dead container passes MinAge. Failed deletes, and removals the runtime's
// re-check refused while the projection saw the container die, are retried
// with backoff through the same timer. Nothing is deleted before the projection is
// synced. Run, Pass and Status may be called concurrently; passes are
// serialized.
type ContainerGC struct {
	st      containerState
	changes <-chan struct{}
	podDir  PodLogDir
	exec    *ContainerExecutor
	opts    ContainerGCOptions
	log     zerolog.Logger

	mu    sync.Mutex // serializes passes; guards retry
	retry map[string]containerRetry

	// blind: the last pass found a running pod whose log dir went (the
	// deleted-pod sign cannot be read); dirState the pod log dir's state
	// the last pass logged. Pass's goroutine only.
	blind    bool
	dirState InputState

	smu    sync.Mutex // guards status, so /status never waits for a pass
	status ContainerGCStatus
}

// keptRetry is the first delay before a re-check refused by the runtime is
// repeated; it doubles up to MaxRetry.
const keptRetry = 200 * time.Millisecond

type containerRetry struct {
	at      time.Time
	backoff time.Duration
}

// ContainerGCStatus is what the container GC did last, for /status.
type ContainerGCStatus struct {
	Policy ContainerPolicy `json:"policy"`
	DryRun bool            `json:"dryRun"`
	Synced bool            `json:"synced"`
	Passes uint64          `json:"passes"`
	// Removed counts removals since start (dry runs excluded).
	Removed uint64 `json:"removed"`
	// NextTimer is when the timer fires next; zero if not armed.
	NextTimer time.Time `json:"nextTimer,omitzero"`
	// Plan is the last pass's plan, Results what became of its removals.
	Plan    ContainerPlan     `json:"plan"`
	Results []ContainerResult `json:"results"`
	Error   string            `json:"error,omitempty"`
}

// NewContainerGC returns a ContainerGC reading st, woken by changes (from
// projection.Live.Subscribe, taken before Live runs) and deleting through
// rt. It fails if the policy is invalid.
func NewContainerGC(d ContainerGCDeps, opts ContainerGCOptions) (*ContainerGC, error) {
	switch {
	case d.State == nil || d.Changes == nil || d.Runtime == nil:
		return nil, errors.New("container gc: a state, its changes and a runtime are required")
	case d.Deletes == nil && !opts.DryRun:
		return nil, errors.New("container gc: deletes need a delete transaction (or DryRun)")
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = clock.System(nil)
	}
	if opts.MaxRetry <= 0 {
		opts.MaxRetry = time.Minute
	}
	exec, err := NewContainerExecutor(ContainerExecutorDeps{Runtime: d.Runtime, Deletes: d.Deletes, Publisher: d.Publisher, Logs: d.Logs},
		ContainerExecutorOptions{DryRun: opts.DryRun, Metrics: opts.Metrics, Log: opts.Log, Clock: opts.Clock})
	if err != nil {
		return nil, err
	}
	return &ContainerGC{
		st: d.State, changes: d.Changes, podDir: d.PodLogDir, exec: exec, opts: opts,
		log:    opts.Log.With().Str("component", "containergc").Logger(),
		retry:  map[string]containerRetry{},
		status: ContainerGCStatus{Policy: opts.Policy, DryRun: opts.DryRun, Plan: emptyContainerPlan(), Results: []ContainerResult{}},
	}, nil
}

func emptyContainerPlan() ContainerPlan {
	return ContainerPlan{Remove: []ContainerItem{}, Keep: []ContainerItem{}}
}

// Run passes at start, on every projection change and when its timer
// fires, until ctx ends; it returns nil then. Errors of a pass are logged
// and retried, never returned.
func (g *ContainerGC) Run(ctx context.Context) error {
	if g.opts.Policy.Prune == PruneOff {
		g.log.Info().Msg("container pruning off")
		<-ctx.Done()
		return nil
	}
	g.log.Info().Str("prune", string(g.opts.Policy.Prune)).Float64("min_age_s", g.opts.Policy.MinAge.Seconds()).
		Int("max_per_container", g.opts.Policy.MaxPerEvictUnit).Int("max_containers", g.opts.Policy.MaxContainers).
		Bool("dry_run", g.opts.DryRun).Msg("container gc started")
	timer := g.opts.Clock.NewTimer(0) // the first pass now
	defer timer.Stop()
	var last, next time.Time // the last pass; when the timer fires
	// changes is nil while the timer is armed to fire by the gap's end: that
	// pass covers every change meanwhile, and a burst of events would
	// otherwise wake this loop once per batch for nothing.
	changes := g.changes
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			if gapEnd := last.Add(g.opts.MinGap); g.opts.Clock.Now().Before(gapEnd) {
				// Too soon after the last pass: the timer, armed no later
				// than the gap's end, makes the pass for every change since.
				if next.IsZero() || gapEnd.Before(next) {
					next = gapEnd
					timer.Stop()
					timer.Reset(max(gapEnd.Sub(g.opts.Clock.Now()), 0))
				}
				changes = nil
				continue
			}
		case <-timer.C():
		}
		if changes == nil {
			changes = g.changes
			drain(changes) // applied before this pass reads the state
		}
		var err error
		last = g.opts.Clock.Now()
		next, err = g.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			g.log.Error().Err(err).Msg("pass")
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(next.Sub(g.opts.Clock.Now()), 0))
		}
	}
}

// Pass plans from the projection now and applies the plan; before the
// projection is synced it does nothing. It returns when the timer must
// fire next (zero: only a change can make anything removable) and the
// per-item errors joined.
func (g *ContainerGC) Pass(ctx context.Context) (next time.Time, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.opts.Clock.Now()
	var plan ContainerPlan
	g.st.View(func(s *projection.State) {
		if s.Synced { // re-read under the same lock as the plan
			// Keep leaves out what is plainly not dead: /status shows why
			// dead containers stay, `gcagent plan` shows everything.
			plan.merge(planContainers(s, g.opts.Policy, now, g.podDir, false))
		}
	})
	g.sayPodSign(plan)
	if plan.Remove == nil {
		return time.Time{}, nil
	}

	// Items whose delete failed wait for their backoff; the timer covers them.
	todo := plan
	todo.Remove = make([]ContainerItem, 0, len(plan.Remove))
	planned := make(map[string]bool, len(plan.Remove))
	next = plan.NextEligible
	for _, it := range plan.Remove {
		planned[it.key()] = true
		if r, ok := g.retry[it.key()]; ok && now.Before(r.at) {
			earliest(&next, r.at)
			continue
		}
		todo.Remove = append(todo.Remove, it)
	}
	for id := range g.retry {
		if !planned[id] {
			delete(g.retry, id)
		}
	}

	results, err := g.exec.Apply(ctx, todo, g.opts.Policy)
	var removed uint64
	for _, r := range results {
		switch r.Outcome {
		case ContainerFailed, ContainerKept:
			// A kept item is one the runtime still calls alive while the
			// projection saw it die: the runtime lags its own events (CRI
			// marks a container exited, a sandbox not ready, after the
			// task exit is published). No event may follow, so look again.
			first := time.Second
			if r.Outcome == ContainerKept {
				first = keptRetry
			}
			rs := g.retry[r.key()]
			rs.backoff = min(max(2*rs.backoff, first), g.opts.MaxRetry)
			rs.at = r.At.Add(rs.backoff)
			g.retry[r.key()] = rs
			earliest(&next, rs.at)
		case ContainerRemoved:
			removed++
			delete(g.retry, r.key())
		default:
			delete(g.retry, r.key())
		}
	}
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	g.opts.Metrics.pass(next)
	g.smu.Lock()
	defer g.smu.Unlock()
	g.status.Synced = true
	g.status.Passes++
	g.status.Removed += removed
	g.status.NextTimer = next
	g.status.Plan = plan
	g.status.Results = results
	g.status.Error = ""
	if err != nil {
		g.status.Error = err.Error()
	}
	return next, err
}

// Plan returns the plan the next pass would apply, deleting nothing (for
// `gcagent plan`). Before the projection is synced it returns ok false.
func (g *ContainerGC) Plan() (plan ContainerPlan, ok bool) {
	now := g.opts.Clock.Now()
	g.st.View(func(s *projection.State) {
		if s.Synced {
			ok = true
			plan.merge(planContainers(s, g.opts.Policy, now, g.podDir, true))
		}
	})
	return plan, ok
}

// sayPodSign logs when the deleted-pod sign becomes readable or not: the
// pod log dir's state as an input, and whether a running pod's dir went.
func (g *ContainerGC) sayPodSign(plan ContainerPlan) {
	if g.podDir == nil || g.opts.Policy.Prune != PruneAll {
		return
	}
	if in := plan.PodLogDir; in.State != g.dirState && plan.Remove != nil {
		g.dirState = in.State
		if in.Known() {
			g.log.Info().Str("pod_log_dir", in.State.String()).Msg("pod log dir read: a pod whose dir is seen to go counts as deleted")
		} else {
			g.log.Warn().Str("pod_log_dir", in.State.String()).Str("cause", in.Cause).Msg("pod log dir not read: no pod counts as deleted until it is")
		}
	}
	if plan.PodSignalBlind != g.blind {
		g.blind = plan.PodSignalBlind
		if g.blind {
			g.log.Warn().Str("pod_log_dir_sign", "unreadable").Msg("a running pod's log dir went where the agent looks (--pod-log-dir is not the kubelet's podLogsDir?): no pod counts as deleted")
		} else {
			g.log.Info().Str("pod_log_dir_sign", "readable").Msg("no running pod's log dir is gone: deleted pods are told by theirs")
		}
	}
}

// Status returns a copy of what the last pass did.
func (g *ContainerGC) Status() ContainerGCStatus {
	g.smu.Lock()
	defer g.smu.Unlock()
	st := g.status
	st.Results = append([]ContainerResult{}, st.Results...)
	return st
}
