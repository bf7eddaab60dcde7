package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
)

// nativeContainers reads and deletes plain containerd containers (no
// io.cri-containerd.kind) of any namespace: the node adapter talks to
// containerd.
type nativeContainers interface {
	// NativeLiveness re-reads the container's task; LiveGone if the
	// container is not found; a *Kept error for a dead container its
	// owner's state keeps (LiveOwnerState, LiveRestartManaged).
	NativeLiveness(ctx context.Context, ns, id string) (Liveness, error)
	// DeleteNative deletes the stopped task and the container with its
	// snapshot, then the state its owner keeps for it outside containerd
	// (nerdctl's), and returns what it cleaned of that state. It must
	// never kill a task; NotFound is success; ErrOwnerWon when its owner
	// deleted it first. Once the container is deleted the error is nil: a
	// failed cleanup is reported in OwnerCleanup.Error.
	DeleteNative(ctx context.Context, ns, id string) (OwnerCleanup, error)
}

// criContainers reads and deletes CRI containers and sandboxes, only
// through the CRI API, so that CRI keeps no stale state.
type criContainers interface {
	// CRIContainerLiveness asks CRI for the container's state.
	CRIContainerLiveness(ctx context.Context, id string) (Liveness, error)
	// RemoveCRIContainer removes an exited container; NotFound is success.
	RemoveCRIContainer(ctx context.Context, id string) error
	criLogPaths
	// CRISandboxLiveness is LiveDead only for a sandbox that is not ready
	// and holds no container.
	CRISandboxLiveness(ctx context.Context, id string) (Liveness, error)
	// RemoveCRISandbox stops and removes the sandbox; NotFound is success.
	RemoveCRISandbox(ctx context.Context, id string) error
}

// containerIdentities reads what tells a container from another one made
// since under its id, for the delete's intent.
type containerIdentities interface {
	// ContainerCreated returns the creation time containerd stamped on
	// the container (CRI's included: each is a containerd container of
	// CRI's namespace); ErrOwnerWon when it is gone.
	ContainerCreated(ctx context.Context, ns, id string) (time.Time, error)
}

// containerRuntime is what the container executor needs; the node
// adapter is the real one.
type containerRuntime interface {
	nativeContainers
	criContainers
	containerIdentities
}

// Container kinds as logged, published and used as metric labels.
const (
	ContainerKindNative    = "native"
	ContainerKindContainer = projection.KindContainer
	ContainerKindSandbox   = projection.KindSandbox
)

// containerKind names the kind of a planned item.
func containerKind(it ContainerItem) string {
	if it.CRIKind == "" {
		return ContainerKindNative
	}
	return it.CRIKind
}

// ContainerOutcome says what the executor did with one planned removal.
type ContainerOutcome string

// Outcomes of ContainerExecutor.Apply.
const (
	ContainerRemoved     ContainerOutcome = "removed"      // deleted now
	ContainerWouldRemove ContainerOutcome = "would-remove" // dry run: dead, not deleted
	ContainerGone        ContainerOutcome = "gone"         // already deleted by someone else (or an earlier pass)
	ContainerKept        ContainerOutcome = "kept"         // the re-check found it not dead
	ContainerFailed      ContainerOutcome = "failed"       // the re-check or the delete failed
)

// ContainerResult is the executor's account of one planned removal.
type ContainerResult struct {
	ContainerItem
	Kind    string           `json:"kind"` // native, container or sandbox
	Outcome ContainerOutcome `json:"outcome"`
	Live    Liveness         `json:"liveness,omitempty"` // what the re-check found
	Error   string           `json:"error,omitempty"`
	At      time.Time        `json:"at"`
	// EligibleAt is when the container became removable under the policy
	// (exit plus MinAge, later if a cap or an emptied pod made it so).
	EligibleAt time.Time `json:"eligibleAt,omitzero"`
	// Detail says why a kept container was kept, when its liveness
	// says it only broadly (owner-state).
	Detail string `json:"detail,omitempty"`
}

// ContainerRemoval is schema.ContainerRemoval (the payload lives in package schema).
type ContainerRemoval = schema.ContainerRemoval

// OwnerCleanup is schema.OwnerCleanup (the payload lives in package schema).
type OwnerCleanup = schema.OwnerCleanup

// ContainerRemovalKey is the deterministic key of the removal of container
// id after the exit at exitedAt: the same run removed twice (a retry after
// a crash) gets the same key, a later run of the same id another.
func ContainerRemovalKey(id string, exitedAt time.Time) string {
	return id + "@" + strconv.FormatInt(exitedAt.UnixNano(), 10)
}

// ContainerExecutorDeps are what a ContainerExecutor works through:
// Runtime is required, Deletes is unless it is a dry run.
type ContainerExecutorDeps struct {
	Runtime   containerRuntime
	Deletes   deleteLog // a *deletion.Manager
	Publisher Publisher // what is not a removal (a dry run's skips); nil: nothing published
	// Logs removes a CRI container's log files and legacy link before the
	// container, in its delete transaction, as the kubelet's removal does
	// (a *logs.ContainerLogs); nil: logs are left alone.
	Logs containerLogFiles
}

// ContainerExecutorOptions carries the executor's collaborators; all are
// optional.
type ContainerExecutorOptions struct {
	// DryRun re-checks, logs and publishes, and deletes nothing.
	DryRun  bool
	Metrics *ContainerMetrics // nil: nothing recorded
	Log     zerolog.Logger    // the zero Logger logs nothing
	Clock   clock.Timers      // nil: the real clock
	// Parallelism is how many removals run at once. Default 4: deletes
	// wait on the shim and the snapshotter, and a burst of exits must not
	// queue behind one another.
	Parallelism int
}

// ContainerExecutor applies container plans: for each planned removal it
// re-reads the container's state from the runtime right before deleting
// it, and deletes only what is still dead, native containers through
// containerd and CRI objects through CRI. Apply is not safe for concurrent
// use: one goroutine (ContainerGC.Run) applies plans.
type ContainerExecutor struct {
	rt      containerRuntime
	logs    containerLogFiles
	deletes deleteLog
	pub     Publisher
	now     func() time.Time
	opts    ContainerExecutorOptions
	log     zerolog.Logger
	mu      sync.Mutex           // guards the maps below while Apply's workers run
	dryRuns map[string]bool      // keys reported in a dry run
	noted   map[string]Liveness  // last re-check refusal logged per id
	emptied map[string]time.Time // pod uid -> when its last container was removed
}

// NewContainerExecutor returns an executor deleting through rt (a Runtime,
// or a fake in tests).
func NewContainerExecutor(d ContainerExecutorDeps, opts ContainerExecutorOptions) (*ContainerExecutor, error) {
	switch {
	case d.Runtime == nil:
		return nil, errors.New("container executor: a runtime is required")
	case d.Deletes == nil && !opts.DryRun:
		return nil, errors.New("container executor: deletes need a delete transaction (or DryRun)")
	}
	if opts.Clock == nil {
		opts.Clock = clock.System(nil)
	}
	if d.Publisher == nil {
		d.Publisher = Discard{}
	}
	if opts.Parallelism <= 0 {
		opts.Parallelism = 4
	}
	return &ContainerExecutor{
		rt: d.Runtime, logs: d.Logs, deletes: d.Deletes, pub: d.Publisher, opts: opts, now: opts.Clock.Now,
		log:     opts.Log.With().Str("component", "containergc").Logger(),
		dryRuns: map[string]bool{},
		noted:   map[string]Liveness{},
		emptied: map[string]time.Time{},
	}, nil
}

// Apply removes plan.Remove, re-checking each right before its delete:
// first the containers, then the sandboxes (so a sandbox is re-checked only
// once its pod's containers are handled), each group on up to Parallelism
// workers; policy is the one the plan was made with (its MinAge dates
// eligibility). It returns one result per planned removal, in plan order,
// and the per-item errors joined: an error on one item does not stop the
// others. It stops early only when ctx ends.
func (e *ContainerExecutor) Apply(ctx context.Context, plan ContainerPlan, policy ContainerPolicy) ([]ContainerResult, error) {
	n := len(plan.Remove)
	results := make([]ContainerResult, n)
	errs := make([]error, n+1)
	done := make([]bool, n)
	planned := make(map[string]bool, n)
	var containers, sandboxes []int
	for i, it := range plan.Remove {
		planned[it.key()] = true
		if containerKind(it) == ContainerKindSandbox {
			sandboxes = append(sandboxes, i)
		} else {
			containers = append(containers, i)
		}
	}
	for _, group := range [][]int{containers, sandboxes} {
		e.each(ctx, group, func(i int) {
			results[i], errs[i] = e.one(ctx, plan, policy, plan.Remove[i])
			done[i] = true
		})
	}
	if err := ctx.Err(); err != nil && slices.Contains(done, false) {
		errs[n] = err
	}
	out := make([]ContainerResult, 0, n)
	for i := range results {
		if done[i] {
			out = append(out, results[i])
		}
	}
	e.forget(planned)
	return out, errors.Join(errs...)
}

// each calls fn for each index on up to Parallelism goroutines, and no more
// once ctx is done.
func (e *ContainerExecutor) each(ctx context.Context, idx []int, fn func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(e.opts.Parallelism, len(idx)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for _, i := range idx {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
}

func (e *ContainerExecutor) one(ctx context.Context, plan ContainerPlan, policy ContainerPolicy, it ContainerItem) (ContainerResult, error) {
	kind := containerKind(it)
	e.mu.Lock()
	r := ContainerResult{ContainerItem: it, Kind: kind, EligibleAt: e.eligibleAt(plan, policy, it)}
	e.mu.Unlock()
	live, err := e.liveness(ctx, kind, it.Namespace, it.ID)
	var kept *Kept
	if errors.As(err, &kept) {
		live, err, r.Detail = kept.Live, nil, kept.Why
	}
	if err != nil {
		e.opts.Metrics.error("recheck")
		r.Outcome, r.Error, r.At = ContainerFailed, err.Error(), e.now()
		return r, fmt.Errorf("re-check %s %s: %w", kind, it.ID, err)
	}
	r.Live = live
	switch {
	case live == LiveGone:
		r.Outcome, r.At = ContainerGone, e.now()
		return r, nil
	case live == LiveDead:
	case live == LiveCreated && kind == ContainerKindContainer && it.State == projection.StateCreated:
		// Planned as never started, past NeverStartedGrace: CRI still says
		// created, so its start never came (containerd marks a failed
		// start exited); the kubelet removes it too.
	default:
		r.Outcome, r.At = ContainerKept, e.now()
		if e.opts.Metrics != nil {
			e.opts.Metrics.kept.WithLabelValues(string(live)).Inc()
		}
		e.mu.Lock()
		first := e.noted[it.key()] != live
		e.noted[it.key()] = live
		e.mu.Unlock()
		if first {
			ev := e.event(e.log.Info(), it, kind).Str("liveness", string(live))
			if r.Detail != "" {
				ev = ev.Str("detail", r.Detail)
			}
			ev.Msg("kept on re-check")
		}
		return r, nil
	}

	key := scopedKey(it.Namespace, ContainerRemovalKey(it.ID, it.ExitedAt))
	removal := ContainerRemoval{
		Namespace: it.Namespace, ID: it.ID, Kind: kind, EvictUnit: it.EvictUnit, PodUID: it.PodUID, PodName: it.PodName,
		PodNamespace: it.PodNamespace, ContainerName: it.ContainerName, Image: it.Image, ExitedAt: it.ExitedAt,
		EligibleAt: r.EligibleAt, Reason: it.Reason, Rule: containerRule(it.Reason, policy), At: e.now(),
	}
	var ref ContainerLogRef
	if kind == ContainerKindContainer && e.logs != nil {
		// The kubelet's order: the log goes first, found by the path CRI
		// gives (which the container's removal takes along).
		path, err := e.rt.CRIContainerLogPath(ctx, it.ID)
		if errors.Is(err, ErrContainerGone) {
			r.Outcome, r.At = ContainerGone, e.now()
			return r, nil
		}
		if err != nil {
			e.opts.Metrics.error("recheck")
			r.Outcome, r.Error, r.At = ContainerFailed, err.Error(), e.now()
			return r, fmt.Errorf("log path of %s %s: %w", kind, it.ID, err)
		}
		ref = logRef(it, path)
		removal.Logs = &ContainerLogs{Path: path}
	}
	if e.opts.DryRun {
		if removal.Logs != nil {
			found, err := e.logs.FindContainerLogs(ref)
			if err != nil {
				found.Kept = err.Error()
			}
			removal.Logs = &found
		}
		return e.dryRun(it, kind, key, removal, r), nil
	}
	// Its identity, read right before the intent: settling tells this
	// container from one made again under its id.
	created, err := e.rt.ContainerCreated(ctx, it.Namespace, it.ID)
	if errors.Is(err, ErrOwnerWon) {
		r.Outcome, r.At = ContainerGone, e.now()
		return r, nil
	}
	if err != nil {
		e.opts.Metrics.error("recheck")
		r.Outcome, r.Error, r.At = ContainerFailed, err.Error(), e.now()
		return r, fmt.Errorf("re-check %s %s: %w", kind, it.ID, err)
	}
	if !it.created.IsZero() && !created.Equal(it.created) {
		// Its owner deleted the container planned and made another under
		// its id since (ctr, a script reusing its ids): that one is not
		// the plan's, and may be about to start.
		e.event(e.log.Info(), it, kind).Time("planned_created", it.created).Time("created", created).
			Msg("made again under its id since the plan: not removed")
		r.Outcome, r.At = ContainerGone, e.now()
		return r, nil
	}
	// The delete transaction: a crash or an unknown outcome after the
	// delete still gets exactly its event, and nothing else's.
	tx, err := e.deletes.Begin(ctx, it.Namespace, Action{Kind: "container", Action: ActionRemoved, Subject: it.ID, Key: key, Data: removal},
		&deletion.Identity{Created: created})
	if err != nil {
		e.opts.Metrics.error("intent")
		r.Outcome, r.Error, r.At = ContainerFailed, err.Error(), e.now()
		return r, fmt.Errorf("remove %s %s: %w", kind, it.ID, err)
	}
	var owner OwnerCleanup
	// The log paths removed before the container: reported on their own
	// (logsAlone) unless the container's removal reports them.
	var alone []LogRemoval
	call := tx.Call(ctx) // checks the agent lock; ends with its hold
	callStart := e.now()
	switch kind {
	case ContainerKindNative:
		owner, err = e.rt.DeleteNative(call, it.Namespace, it.ID)
	case ContainerKindSandbox:
		err = e.rt.RemoveCRISandbox(call, it.ID)
	default:
		if removal.Logs != nil && call.Err() == nil {
			removed, paths, lerr := e.logs.RemoveContainerLogs(ref)
			removal.Logs, alone = &removed, paths
			if lerr != nil {
				// As the kubelet: the container stays, for a retry.
				_ = tx.Abort()
				e.opts.Metrics.error("remove")
				e.event(e.log.Warn(), it, kind).Err(lerr).Msg("log not removed: the container stays")
				e.logsAlone(it, alone, "the log not removed in full, the container stays: "+lerr.Error())
				r.Outcome, r.Error, r.At = ContainerFailed, lerr.Error(), e.now()
				return r, fmt.Errorf("remove the log of %s %s: %w", kind, it.ID, lerr)
			}
		}
		err = e.rt.RemoveCRIContainer(call, it.ID)
	}
	r.At = e.now()
	if errors.Is(err, ErrOwnerWon) {
		// The owner deleted it between our re-check and our delete:
		// counted, never an error, never retried, and not our removal.
		_ = tx.Abort()
		e.opts.Metrics.ownerWon(kind)
		e.event(e.log.Debug(), it, kind).Msg("owner deleted it first")
		e.logsAlone(it, alone, "its owner removed the container first")
		r.Outcome = ContainerGone
		return r, nil
	}
	if err != nil {
		// Did the delete happen? containerd says, before anything else
		// is deleted.
		switch out, serr := tx.Settle(ctx); out {
		case deletion.Happened:
			e.event(e.log.Warn(), it, kind).Err(err).Msg("the delete reported an error but happened")
		case deletion.NotHappened:
			e.opts.Metrics.error("remove")
			e.logsAlone(it, alone, "the container's removal failed: "+err.Error())
			r.Outcome, r.Error = ContainerFailed, err.Error()
			return r, fmt.Errorf("remove %s %s: %w", kind, it.ID, err)
		default:
			// Settled later, its container.removed carries the intent's
			// data, which names no log file: they are reported now.
			e.opts.Metrics.error("remove")
			e.logsAlone(it, alone, "the container's removal failed, its outcome not known yet: "+err.Error())
			r.Outcome, r.Error = ContainerFailed, err.Error()
			return r, fmt.Errorf("remove %s %s: outcome unknown (%w): %w", kind, it.ID, serr, err)
		}
	}
	r.Outcome = ContainerRemoved
	if kind == ContainerKindContainer && it.PodUID != "" {
		e.mu.Lock()
		e.emptied[it.PodUID] = r.At
		e.mu.Unlock()
	}
	latency := r.At.Sub(r.EligibleAt)
	if m := e.opts.Metrics; m != nil {
		m.removed.WithLabelValues(it.Namespace, kind, string(it.Reason)).Inc()
		if !r.EligibleAt.IsZero() {
			m.latency.WithLabelValues(kind).Observe(max(latency, 0).Seconds())
		}
	}
	// delete_call_s: containerd's (or CRI's) own time for the delete,
	// part of latency_s; the rest is the agent's.
	logsEvent(e.event(e.log.Info(), it, kind), removal.Logs).Time("exited_at", it.ExitedAt).Float64("latency_s", latency.Seconds()).
		Float64("delete_call_s", r.At.Sub(callStart).Seconds()).Msg("removed")
	removal.At, removal.LatencySecs = r.At, latency.Seconds()
	if owner.Owner != "" {
		removal.OwnerState = &owner
		if owner.Error != "" {
			// The container is gone: not a failed delete.
			e.event(e.log.Warn(), it, kind).Str("owner", owner.Owner).Strs("removed", owner.Removed).
				Str("error", owner.Error).Msg("the container is removed but not all of its owner's state")
		}
	}
	if err := tx.Commit(removal); err != nil {
		e.opts.Metrics.error("publish")
		e.log.Warn().Str("container", it.ID).Err(err).Msg("store the removal's event")
	}
	return r, nil
}

// dryRun reports, once per container and exit, that a dry run would
// remove it: logged, and published as container.skipped with reason
// dry-run, never on the removal subject.
func (e *ContainerExecutor) dryRun(it ContainerItem, kind, key string, removal ContainerRemoval, r ContainerResult) ContainerResult {
	r.Outcome, r.At = ContainerWouldRemove, e.now()
	key += "#dry-run"
	e.mu.Lock()
	reported := e.dryRuns[key]
	e.dryRuns[key] = true
	e.mu.Unlock()
	if reported {
		return r
	}
	latency := r.At.Sub(r.EligibleAt)
	logsEvent(e.event(e.log.Info(), it, kind), removal.Logs).Time("exited_at", it.ExitedAt).Float64("latency_s", latency.Seconds()).
		Bool("dry_run", true).Msg("would remove")
	removal.At, removal.LatencySecs, removal.DryRun = r.At, latency.Seconds(), true
	if err := e.pub.Publish(Action{Kind: "container", Action: ActionSkipped, Subject: it.ID, Key: key,
		Data: ContainerSkip{ContainerRemoval: removal, SkipReason: schema.ReasonDryRun}}); err != nil {
		e.opts.Metrics.error("publish")
		e.log.Warn().Str("container", it.ID).Err(err).Msg("publish dry run")
	}
	return r
}

// ContainerSkip is schema.ContainerSkip (the payload lives in package schema).
type ContainerSkip = schema.ContainerSkip

func (e *ContainerExecutor) liveness(ctx context.Context, kind, ns, id string) (Liveness, error) {
	switch kind {
	case ContainerKindNative:
		return e.rt.NativeLiveness(ctx, ns, id)
	case ContainerKindSandbox:
		return e.rt.CRISandboxLiveness(ctx, id)
	case ContainerKindContainer:
		return e.rt.CRIContainerLiveness(ctx, id)
	}
	// A kind this agent does not know: never touch it.
	return LiveUnknown, nil
}

func (e *ContainerExecutor) event(ev *zerolog.Event, it ContainerItem, kind string) *zerolog.Event {
	ev = ev.Str("namespace", it.Namespace).Str("container", it.ID).Str("kind", kind).Str("reason", string(it.Reason))
	if it.PodUID != "" {
		ev = ev.Str("pod", it.PodNamespace+"/"+it.PodName).Str("pod_uid", it.PodUID)
	}
	if it.ContainerName != "" {
		ev = ev.Str("name", it.ContainerName)
	}
	return ev
}

// forget drops what is remembered of containers no longer planned, so the
// executor's memory stays bounded by the plan.
func (e *ContainerExecutor) forget(planned map[string]bool) {
	for id := range e.noted {
		if !planned[id] {
			delete(e.noted, id)
		}
	}
	for key := range e.dryRuns {
		if !planned[key[:strings.LastIndexByte(key, '@')]] {
			delete(e.dryRuns, key)
		}
	}
	horizon := e.now().Add(-time.Hour)
	for uid, t := range e.emptied {
		if t.Before(horizon) {
			delete(e.emptied, uid)
		}
	}
}

// eligibleAt dates when it became removable: its exit plus MinAge; for a
// per-unit cap, no earlier than when the newer sibling that pushed it over
// the cap passed MinAge; for a sandbox, no earlier than when the last
// container of its pod was removed. Zero if the exit time is unknown.
func (e *ContainerExecutor) eligibleAt(plan ContainerPlan, policy ContainerPolicy, it ContainerItem) time.Time {
	if it.ExitedAt.IsZero() {
		return time.Time{}
	}
	at := it.ExitedAt.Add(policy.MinAge)
	if it.CRIKind == projection.KindSandbox {
		at = it.ExitedAt // no MinAge for sandboxes
	}
	switch it.Reason {
	case ReasonTTLExpired:
		// The planner dated it: owner done (collected, or exit + grace) + TTL.
		if !it.EligibleAt.IsZero() {
			at = it.EligibleAt
		}
	case ReasonPerUnitCap:
		if n := policy.MaxPerEvictUnit; n > 0 {
			var newer []time.Time
			for _, list := range [][]ContainerItem{plan.Keep, plan.Remove} {
				for _, o := range list {
					if o.EvictUnit == it.EvictUnit && o.Namespace == it.Namespace && o.ID != it.ID && o.State == projection.StateExited &&
						o.Reason != ReasonTooYoung && o.ExitedAt.After(it.ExitedAt) {
						newer = append(newer, o.ExitedAt)
					}
				}
			}
			if len(newer) >= n {
				// The n-th newer sibling, counting from it, became eligible last.
				slices.SortFunc(newer, time.Time.Compare)
				at = later(at, newer[n-1].Add(policy.MinAge))
			}
		}
		at = later(at, it.EligibleAt) // the kubelet moved on then
	case ReasonGlobalCap:
		at = later(at, it.EligibleAt) // the kubelet moved on then
	case ReasonSandboxOrphaned, ReasonPodDeleted:
		if t, ok := e.emptied[it.PodUID]; ok && it.PodUID != "" && it.CRIKind == projection.KindSandbox {
			at = later(at, t)
		}
	}
	return at
}

// containerRule names the policy rule behind a removal, for the published action.
func containerRule(r Reason, p ContainerPolicy) string {
	switch r {
	case ReasonPerUnitCap:
		return fmt.Sprintf("maximum-dead-containers-per-container=%d", p.MaxPerEvictUnit)
	case ReasonGlobalCap:
		return fmt.Sprintf("maximum-dead-containers=%d", p.MaxContainers)
	case ReasonSandboxOrphaned:
		return "sandbox-of-empty-pod"
	case ReasonPodDeleted:
		return fmt.Sprintf("pod-deleted, pod-log-grace=%s", p.PodGrace)
	}
	return string(r)
}
