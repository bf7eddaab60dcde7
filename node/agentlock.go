package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
)

// The agent lock: one agent per containerd, whatever its state dir, its
// mount namespace or its pid namespace. It is held in containerd itself,
// as a lease of namespace events.AgentNamespace (never managed, so never
// listed, counted or collected by an agent), holding no resource (so it
// protects nothing from containerd's GC), labelled with its holder's
// identity. Leases cannot be updated, so the lock is a generation: the
// lease lock.<n> with the highest n is the lock, and creating lock.<n+1>
// (containerd's Create fails if it exists: two agents cannot both make
// it) is how the holder renews it every period and how another agent
// takes it.
//
// The promise: no two agents' delete windows overlap. A holder's hold
// ends two periods after the earliest attempt that may have made its
// generation began (a create whose answer was lost may have made it when
// sent); each delete call's context ends with the hold, so gRPC refuses a
// call sent after it. Another agent deletes only three periods after it
// saw the holder's last generation (a watch that saw no renewal, or a
// take-over's wait): a period of margin for a call containerd applies
// after its deadline. A waiting agent counts on both its clock and its
// timers (a forward step of one does not shorten the wait); a holder's
// hold ends by whichever ends first.

// lockPrefix starts the id of every generation of the lock.
const lockPrefix = "lock."

// lockLabelTookOver says, on each lease of a holder that took the lock
// over (or took it from a dead one that had), how many seconds before
// that lease's create began it did: another agent learns from it that the
// one it takes from may have an agent still deleting behind it, and that
// a --take-over now would take the lock back and forth.
const lockLabelTookOver = "gcagent.io/took-over-s"

// DefaultLockPeriod is how often the holder renews the agent lock.
const DefaultLockPeriod = 10 * time.Second

// HeldError says another agent holds the lock of this containerd.
type HeldError struct {
	By AgentID
	// TookOver, when set, is at least how long ago By took the lock over
	// itself, and Again how long after now --take-over may take it from
	// it: a --take-over is refused meanwhile.
	TookOver, Again time.Duration
}

func (e *HeldError) Error() string {
	if e.Again > 0 {
		return fmt.Sprintf("another gcagent runs on this containerd: %s; it took containerd over itself recently (%s before its last renewal), "+
			"and --take-over is refused for up to %s more (two agents started with --take-over would take it from each other for ever); "+
			"stop it, or start this one again then", e.By, e.TookOver.Round(time.Second), e.Again.Round(time.Second))
	}
	return "another gcagent runs on this containerd: " + e.By.String() + "; stop it, or start this one with --take-over"
}

// LostError says another agent took the lock over: this one must stop.
type LostError struct{ By AgentID }

func (e *LostError) Error() string {
	return "another gcagent took this containerd over: " + e.By.String() + "; this one stops"
}

// ErrNotHeld says this agent may not delete now: it does not hold the
// agent lock, or has not renewed it recently enough to be sure.
var ErrNotHeld = errors.New("this agent does not hold containerd's agent lock now")

// LockOptions tune an AgentLock.
type LockOptions struct {
	// Period is how often the holder renews; default DefaultLockPeriod.
	Period time.Duration
	// Clock reads the time and arms the timers: monotonic, like the
	// agent's clock. Default Go's.
	Clock clock.Timers
	Log   zerolog.Logger
	// alive reports whether the process of an agent of this boot and pid
	// namespace runs, and whether that is known (tests replace it).
	alive func(AgentID) (alive, known bool)
}

// AgentLock is this agent's hold on the agent lock of one containerd. It
// is safe for concurrent use.
type AgentLock struct {
	store leaseStore
	me    AgentID
	token string // this run's: tells its own leases from another's
	o     LockOptions

	mu      sync.Mutex
	gen     uint64    // the generation held; 0: none
	renewed time.Time // when the earliest attempt that may have made gen began
	// tries holds, for each generation this run tried to make and has not
	// confirmed yet, when its first attempt began: any attempt whose
	// answer was lost may have made it then.
	tries map[uint64]time.Time
	// notBefore and waits are the take-over waits on the clock and on the
	// timers: a holder taken over may still delete until both are over.
	notBefore time.Time
	waits     []clock.Timer
	tookOver  time.Time     // when this run (or the dead run it took from) took over; zero: never
	landing   clock.Timer   // armed for a period after a delete call was cut off
	landPend  bool          // landing has not fired yet
	again     chan struct{} // closed by the next renewal after failed ones
	lostTo    *AgentID      // the agent that took it over, once a renewal found it
}

// NewAgentLock returns the lock of the containerd store talks to (a
// LockStore) for agent me. A store that keeps no namespace labels (only
// leases: tests) counts the generations from 1 again after a release.
func NewAgentLock(store leaseStore, me AgentID, o LockOptions) *AgentLock {
	if o.Period <= 0 {
		o.Period = DefaultLockPeriod
	}
	if o.Clock == nil {
		o.Clock = clock.System(nil)
	}
	if o.alive == nil {
		o.alive = processAlive
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &AgentLock{store: store, me: me, token: hex.EncodeToString(b[:]), o: o, tries: map[uint64]time.Time{},
		again: make(chan struct{})}
}

// lockCallTimeout bounds each call of the lock to containerd.
func (l *AgentLock) lockCallTimeout() time.Duration { return l.o.Period / 2 }

// staleAfter is how long an agent watches a holder it cannot prove dead
// before it takes over, and how long a taker waits before it deletes:
// three renewals missed.
func (l *AgentLock) staleAfter() time.Duration { return 3 * l.o.Period }

// holdFor is how long after its last renewal began the holder may still
// delete: a period less than staleAfter, so that it has stopped, and a
// call it sent just before has landed, before another agent deletes.
func (l *AgentLock) holdFor() time.Duration { return 2 * l.o.Period }

// recentTakeOver is how long after a holder took the lock over a
// --take-over is refused against it: two agents both started with
// --take-over would otherwise take it from each other for ever, and
// neither would delete.
func (l *AgentLock) recentTakeOver() time.Duration { return 30 * l.o.Period }

// generation is one lease of the lock.
type generation struct {
	n     uint64
	lease leases.Lease
}

func (g *generation) holder() AgentID { return agentOf(g.lease.Labels) }

// tookOverAgo is at least how long ago g's holder took the lock over, as
// its label says (ok false: it did not). A label that does not parse
// counts as a take-over just now: fail closed.
func (g *generation) tookOverAgo() (ago time.Duration, ok bool) {
	v, ok := g.lease.Labels[lockLabelTookOver]
	if !ok {
		return 0, false
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || s < 0 || s > 1e9 {
		return 0, true
	}
	return time.Duration(s * float64(time.Second)), true
}

func lockID(n uint64) string { return lockPrefix + strconv.FormatUint(n, 10) }

func (l *AgentLock) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(namespaces.WithNamespace(ctx, events.AgentNamespace), l.lockCallTimeout())
}

// generations lists the lock's leases, highest first.
func (l *AgentLock) generations(ctx context.Context) ([]generation, error) {
	ctx, cancel := l.ctx(ctx)
	defer cancel()
	all, err := l.store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the agent lock's leases: %w", err)
	}
	var out []generation
	for _, ls := range all {
		n, err := strconv.ParseUint(strings.TrimPrefix(ls.ID, lockPrefix), 10, 64)
		if !strings.HasPrefix(ls.ID, lockPrefix) || err != nil || n == 0 {
			continue
		}
		out = append(out, generation{n: n, lease: ls})
	}
	for i := 1; i < len(out); i++ { // a handful: insertion sort, highest first
		for j := i; j > 0 && out[j].n > out[j-1].n; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// create makes generation n of the lock, atomically: false when another
// agent made it first (a lease of n that is this run's own, from an
// earlier attempt whose answer was lost, counts as made). Each attempt is
// recorded before it is sent: confirm counts the hold from the first.
func (l *AgentLock) create(ctx context.Context, n uint64) (bool, error) {
	start := l.o.Clock.Now()
	l.mu.Lock()
	if first, ok := l.tries[n]; !ok || start.Before(first) {
		l.tries[n] = start
	}
	labels := l.me.labels(l.token)
	if !l.tookOver.IsZero() && start.Sub(l.tookOver) < l.recentTakeOver() {
		labels = maps.Clone(labels)
		labels[lockLabelTookOver] = strconv.FormatFloat(max(0, start.Sub(l.tookOver)).Seconds(), 'f', 3, 64)
	}
	l.mu.Unlock()
	cctx, cancel := l.ctx(ctx)
	defer cancel()
	_, err := l.store.Create(cctx, leases.WithID(lockID(n)), leases.WithLabels(labels))
	if err == nil {
		return true, nil
	}
	if !errdefs.IsAlreadyExists(err) {
		return false, fmt.Errorf("create the agent lock's lease %s: %w", lockID(n), err)
	}
	gens, err := l.generations(ctx)
	if err != nil {
		return false, err
	}
	for _, g := range gens {
		if g.n == n {
			return g.lease.Labels[lockLabelToken] == l.token, nil
		}
	}
	return false, nil // made and already deleted: not ours either
}

// confirm makes n, made by this run, the generation held: its hold counts
// from the first attempt that may have made it.
func (l *AgentLock) confirm(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen, l.renewed = n, l.tries[n]
	for k := range l.tries {
		if k <= n {
			delete(l.tries, k)
		}
	}
}

// drop deletes the lock's generations below n, best effort.
func (l *AgentLock) drop(ctx context.Context, gens []generation, n uint64) {
	for _, g := range gens {
		if g.n < n {
			cctx, cancel := l.ctx(ctx)
			if err := l.store.Delete(cctx, g.lease); err != nil && !errdefs.IsNotFound(err) {
				l.o.Log.Debug().Err(err).Str("lease", g.lease.ID).Msg("cannot delete an old generation of the agent lock")
			}
			cancel()
		}
	}
}

// The reasons Acquire takes the lock for. After deadStateDir and
// deadProcess another agent may still delete: the dead holder may have
// taken the lock over from it.
const (
	deadOwn        = "this run's own"
	deadStateDir   = "the last run of this state dir"
	deadProcess    = "its process is gone"
	deadPrevBoot   = "a previous boot"
	reasonTakeOver = "--take-over"
)

// dead says why the holder of g has certainly stopped, or "" when it may
// run: the last run of this very state dir (its lock is held now), a
// previous boot, a process that is gone in this boot and pid namespace.
func (l *AgentLock) dead(g generation) string {
	h := g.holder()
	switch {
	case g.lease.Labels[lockLabelToken] == l.token:
		return deadOwn
	case h.StateID != "" && h.StateID == l.me.StateID:
		return deadStateDir
	case h.BootID != "" && l.me.BootID != "" && h.BootID != l.me.BootID:
		return deadPrevBoot
	}
	if alive, known := l.process(h); known && !alive {
		return deadProcess
	}
	return ""
}

// process says whether h's process runs, when h is of this boot and pid
// namespace and its process can be read; known is false otherwise.
func (l *AgentLock) process(h AgentID) (alive, known bool) {
	if h.BootID == "" || h.BootID != l.me.BootID || h.PidNS == "" || h.PidNS != l.me.PidNS || h.Pid <= 0 {
		return false, false
	}
	return l.o.alive(h)
}

// Acquire takes the lock. When another agent holds it: one proven to
// have stopped (the last run of this state dir, a previous boot, a
// process gone) is taken over at once; one proven alive refuses at once
// with a *HeldError; any other is watched for staleAfter and taken over
// if it renewed nothing meanwhile, else refused. takeOver takes it over
// whatever its holder, deliberately: that holder stops at its next
// renewal, and this agent deletes nothing until staleAfter has passed;
// but not from a holder that took it over itself within recentTakeOver
// (the refusal says when it may be tried again): the lock is then taken
// as without takeOver. A dead holder that had taken over leaves its wait
// to the agent that takes from it. Any other error is containerd's: try
// again later (the waits of this run's attempts hold, whichever of them
// made the lease).
func (l *AgentLock) Acquire(ctx context.Context, takeOver bool) error {
	for {
		gens, err := l.generations(ctx)
		if err != nil {
			return err
		}
		var top *generation
		why := "none held it"
		if len(gens) > 0 {
			top = &gens[0]
			why = l.dead(*top)
		}
		start := l.o.Clock.Now()
		var wait time.Duration // until an agent taken over has stopped deleting
		var below *generation  // a lower generation whose holder may still delete
		switch {
		case top == nil:
		case why != "":
			// An earlier attempt of this run (its answer lost) armed its
			// wait already. A dead holder that took over leaves its wait.
			if ago, ok := top.tookOverAgo(); ok && (why == deadStateDir || why == deadProcess) {
				l.inherit(start, ago)
				wait = max(0, l.staleAfter()-ago)
			}
			// A lease below the top whose holder may run: the top is a
			// create containerd applied late (above a lock whose leases
			// were deleted by hand, or counted again from 1 by a store
			// without labels), or its holder took over from that one
			// lately. That holder may delete until it renews and finds
			// the top: this is a take-over.
			if below = l.liveBelow(gens[1:]); below != nil {
				wait = l.staleAfter()
				l.inherit(start, 0)
			}
		case takeOver && l.recentlyTookOver(top) == 0:
			why, wait = reasonTakeOver, l.staleAfter()
			l.inherit(start, 0)
		default:
			again := time.Duration(0)
			if takeOver {
				again = l.recentlyTookOver(top)
			}
			ago, _ := top.tookOverAgo()
			refuse := func(by AgentID) error {
				if again > 0 {
					return &HeldError{By: by, TookOver: ago, Again: again}
				}
				return &HeldError{By: by}
			}
			if alive, known := l.process(top.holder()); known && alive {
				return refuse(top.holder())
			}
			renewed, released, err := l.watch(ctx, top.n)
			switch {
			case err != nil:
				return err
			case renewed != nil:
				return refuse(renewed.holder())
			case released:
				why = "released"
			default:
				why = fmt.Sprintf("not renewed for %s", l.staleAfter())
			}
		}
		next := uint64(1)
		if top != nil {
			next = top.n + 1
		}
		// Past the last release, whatever the top: a generation below it
		// may be left (a drop that never reached containerd), and a
		// renewal the releaser sent before it released may still land.
		r, err := l.lastReleased(ctx)
		if err != nil {
			return err
		}
		if r.last > 0 {
			next = max(next, r.last+2)
		}
		if (top == nil || why == "released") && r.tookOver { // it released within its take-over's wait: the rest is this run's
			l.inherit(start, r.ago)
			wait = max(wait, l.staleAfter()-r.ago)
		}
		if wait > 0 {
			l.waitFor(wait) // armed before the create: whatever answer is lost, it holds
		}
		ok, err := l.create(ctx, next)
		if err != nil {
			return err
		}
		if !ok {
			continue // another agent moved first: look again
		}
		// A create containerd applied late may have made an id again
		// below the top (it was dropped since): held only when no higher
		// generation exists.
		if gens, err = l.generations(ctx); err != nil {
			return err // not confirmed: the next attempt finds it its own and looks again
		}
		if len(gens) == 0 || gens[0].n > next {
			continue
		}
		l.confirm(next)
		l.drop(ctx, gens, next)
		ev := l.o.Log.Info().Str("lease", events.AgentNamespace+"/"+lockID(next))
		if top != nil && why != deadOwn {
			ev = ev.Str("previous", top.holder().String()).Str("reason", why)
		}
		if below != nil {
			ev = ev.Str("below", below.holder().String())
		}
		if left := l.waitLeft(); left > 0 {
			ev = ev.Float64("deletes_wait_s", left.Seconds())
		}
		ev.Msg("holding containerd's agent lock")
		return nil
	}
}

// recentlyTookOver returns how long from now a --take-over may take the
// lock from top's holder: zero unless it took over within recentTakeOver.
func (l *AgentLock) recentlyTookOver(top *generation) time.Duration {
	ago, ok := top.tookOverAgo()
	if !ok || ago >= l.recentTakeOver() {
		return 0
	}
	return l.recentTakeOver() - ago
}

// liveBelow returns the first of gens whose holder may run (not this
// run, not proven dead), or nil.
func (l *AgentLock) liveBelow(gens []generation) *generation {
	for i := range gens {
		if l.dead(gens[i]) == "" {
			return &gens[i]
		}
	}
	return nil
}

// inherit records a take-over ago before start (this run's, ago 0, or
// that of a dead holder that took over ago before its last lease): the
// leases this run makes say so.
func (l *AgentLock) inherit(start time.Time, ago time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if at := start.Add(-ago); at.After(l.tookOver) {
		l.tookOver = at
	}
}

// watch polls the lock for staleAfter, on the agent's clock and on its
// timers both, and returns the generation that replaced n, or nil when
// none did (released: none is left at all). A poll that fails ends it
// with the error: time containerd did not answer is not time the holder
// failed to renew.
func (l *AgentLock) watch(ctx context.Context, n uint64) (renewed *generation, released bool, err error) {
	l.o.Log.Info().Str("lease", events.AgentNamespace+"/"+lockID(n)).Float64("within_s", l.staleAfter().Seconds()).
		Msg("another agent's lock on containerd: watching whether it renews it")
	poll := l.o.Period / 5
	t := l.o.Clock.NewTimer(poll)
	defer t.Stop()
	end := l.o.Clock.Now().Add(l.staleAfter())
	waited := time.Duration(0) // on the timers: a step of the clock does not shorten it
	for {
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-t.C():
			waited += poll
		}
		gens, err := l.generations(ctx)
		switch {
		case err != nil:
			return nil, false, err
		case len(gens) == 0:
			return nil, true, nil
		case gens[0].n != n:
			return &gens[0], false, nil
		case !l.o.Clock.Now().Before(end) && waited >= l.staleAfter():
			return nil, false, nil
		}
		t.Reset(poll)
	}
}
