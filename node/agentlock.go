package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
// takes it. A holder deletes only while its last renewal began less than
// two periods ago; an agent takes over a holder it cannot prove dead only
// after watching, on its own monotonic clock, three periods pass without
// a renewal.

// lockPrefix starts the id of every generation of the lock.
const lockPrefix = "lock."

// DefaultLockPeriod is how often the holder renews the agent lock.
const DefaultLockPeriod = 10 * time.Second

// HeldError says another agent holds the lock of this containerd.
type HeldError struct{ By AgentID }

func (e *HeldError) Error() string {
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

// leaseStore is the part of containerd's leases service the lock uses.
type leaseStore interface {
	Create(context.Context, ...leases.Opt) (leases.Lease, error)
	Delete(context.Context, leases.Lease, ...leases.DeleteOpt) error
	List(context.Context, ...string) ([]leases.Lease, error)
}

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

	mu        sync.Mutex
	gen       uint64        // the generation held; 0: none
	renewed   time.Time     // when the last successful renewal (or the take) began
	notBefore time.Time     // a holder taken over may still delete until then
	again     chan struct{} // closed by the next renewal after failed ones
	lostTo    *AgentID      // the agent that took it over, once a renewal found it
}

// NewAgentLock returns the lock of the containerd store talks to
// (client.LeasesService()) for agent me.
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
	return &AgentLock{store: store, me: me, token: hex.EncodeToString(b[:]), o: o, again: make(chan struct{})}
}

// lockCallTimeout bounds each call of the lock to containerd.
func (l *AgentLock) lockCallTimeout() time.Duration { return l.o.Period / 2 }

// staleAfter is how long an agent watches a holder it cannot prove dead
// before it takes over: three renewals missed.
func (l *AgentLock) staleAfter() time.Duration { return 3 * l.o.Period }

// holdFor is how long after its last renewal began the holder may still
// delete: less than staleAfter, so that it has stopped before another
// agent can take over.
func (l *AgentLock) holdFor() time.Duration { return 2 * l.o.Period }

// generation is one lease of the lock.
type generation struct {
	n     uint64
	lease leases.Lease
}

func (g *generation) holder() AgentID { return agentOf(g.lease.Labels) }

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
// earlier attempt whose answer was lost, counts as made).
func (l *AgentLock) create(ctx context.Context, n uint64) (bool, error) {
	cctx, cancel := l.ctx(ctx)
	defer cancel()
	_, err := l.store.Create(cctx, leases.WithID(lockID(n)), leases.WithLabels(l.me.labels(l.token)))
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

// dead says why the holder of g has certainly stopped, or "" when it may
// run: the last run of this very state dir (its lock is held now), a
// previous boot, a process that is gone in this boot and pid namespace.
func (l *AgentLock) dead(g generation) string {
	h := g.holder()
	switch {
	case g.lease.Labels[lockLabelToken] == l.token:
		return "this run's own"
	case h.StateID != "" && h.StateID == l.me.StateID:
		return "the last run of this state dir"
	case h.BootID != "" && l.me.BootID != "" && h.BootID != l.me.BootID:
		return "a previous boot"
	}
	if alive, known := l.process(h); known && !alive {
		return "its process is gone"
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
// renewal, and this agent deletes nothing until two periods have passed.
// Any other error is containerd's: try again later.
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
		wait := false // until a taken-over holder has stopped deleting
		switch {
		case why != "":
		case takeOver:
			why, wait = "--take-over", true
		default:
			if alive, known := l.process(top.holder()); known && alive {
				return &HeldError{By: top.holder()}
			}
			renewed, released, err := l.watch(ctx, top.n)
			switch {
			case err != nil:
				return err
			case renewed != nil:
				return &HeldError{By: renewed.holder()}
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
		start := l.o.Clock.Now()
		ok, err := l.create(ctx, next)
		if err != nil {
			return err
		}
		if !ok {
			continue // another agent moved first: look again
		}
		l.mu.Lock()
		l.gen, l.renewed = next, start
		if wait {
			l.notBefore = start.Add(l.holdFor())
		}
		l.mu.Unlock()
		l.drop(ctx, gens, next)
		ev := l.o.Log.Info().Str("lease", events.AgentNamespace+"/"+lockID(next))
		if top != nil && why != "this run's own" {
			ev = ev.Str("previous", top.holder().String()).Str("reason", why)
			if wait {
				ev = ev.Float64("deletes_wait_s", l.holdFor().Seconds())
			}
		}
		ev.Msg("holding containerd's agent lock")
		return nil
	}
}

// watch polls the lock for staleAfter on the agent's clock and returns
// the generation that replaced n, or nil when none did (released: none is
// left at all). A poll that fails ends it with the error: time containerd
// did not answer is not time the holder failed to renew.
func (l *AgentLock) watch(ctx context.Context, n uint64) (renewed *generation, released bool, err error) {
	l.o.Log.Info().Str("lease", events.AgentNamespace+"/"+lockID(n)).Float64("within_s", l.staleAfter().Seconds()).
		Msg("another agent's lock on containerd: watching whether it renews it")
	t := l.o.Clock.NewTimer(l.o.Period / 5)
	defer t.Stop()
	end := l.o.Clock.Now().Add(l.staleAfter())
	for {
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-t.C():
		}
		gens, err := l.generations(ctx)
		switch {
		case err != nil:
			return nil, false, err
		case len(gens) == 0:
			return nil, true, nil
		case gens[0].n != n:
			return &gens[0], false, nil
		case !l.o.Clock.Now().Before(end):
			return nil, false, nil
		}
		t.Reset(l.o.Period / 5)
	}
}

// Held returns nil while this agent may delete: it holds the lock, a
// holder it took over has stopped, and its last renewal began less than
// two periods ago. Else an error wrapping ErrNotHeld that says why.
func (l *AgentLock) Held() error {
	now := l.o.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.gen == 0 && l.lostTo != nil:
		return fmt.Errorf("%w: taken over by %s", ErrNotHeld, l.lostTo)
	case l.gen == 0:
		return fmt.Errorf("%w: not taken yet", ErrNotHeld)
	case now.Before(l.notBefore):
		return fmt.Errorf("%w: the agent it took over may delete for %s more", ErrNotHeld, l.notBefore.Sub(now).Round(time.Second))
	case now.Sub(l.renewed) >= l.holdFor():
		return fmt.Errorf("%w: not renewed for %s (containerd does not answer)", ErrNotHeld, now.Sub(l.renewed).Round(time.Second))
	}
	return nil
}

// WaitHeld returns nil once Held does, or ctx's error when it ends first.
func (l *AgentLock) WaitHeld(ctx context.Context) error {
	t := l.o.Clock.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
		}
		if l.Held() == nil {
			return nil
		}
		t.Reset(l.o.Period / 5)
	}
}

// HeldAgain returns a channel closed by the next renewal that follows
// failed ones (containerd did not answer): deletes refused meanwhile may
// be tried again. Each call after it closed returns a new one.
func (l *AgentLock) HeldAgain() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.again
}

// Run renews the lock every period until ctx ends (Release gives it up).
// It returns a *LostError as soon as another agent took it over (this
// agent must stop); a renewal containerd does not answer is tried again,
// and Held fails meanwhile once two periods have passed.
func (l *AgentLock) Run(ctx context.Context) error {
	t := l.o.Clock.NewTimer(l.o.Period)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		err := l.renew(ctx)
		var lost *LostError
		if errors.As(err, &lost) {
			return err
		}
		if err != nil && !failing && ctx.Err() == nil {
			l.o.Log.Warn().Err(err).Msg("cannot renew containerd's agent lock; deletes stop if it goes on")
		}
		if err == nil && failing {
			l.o.Log.Info().Msg("containerd's agent lock renewed again")
			l.mu.Lock()
			close(l.again)
			l.again = make(chan struct{})
			l.mu.Unlock()
		}
		failing = err != nil
		next := l.o.Period
		if failing {
			next = l.o.Period / 5
		}
		t.Reset(next)
	}
}

// renew makes the next generation, checks that no higher one exists (a
// lock whose leases were deleted by hand, taken meanwhile by another
// agent that then renewed past it) and drops the ones below.
func (l *AgentLock) renew(ctx context.Context) error {
	l.mu.Lock()
	n := l.gen
	l.mu.Unlock()
	start := l.o.Clock.Now()
	ok, err := l.create(ctx, n+1)
	if err != nil {
		return err
	}
	var gens []generation
	if ok {
		if gens, err = l.generations(ctx); err != nil {
			return err // not confirmed: the next renewal finds n+1 its own and looks again
		}
	}
	if !ok || len(gens) > 0 && gens[0].n > n+1 {
		by := AgentID{Node: "unknown"}
		if gens == nil {
			gens, _ = l.generations(ctx)
		}
		if len(gens) > 0 {
			by = gens[0].holder()
		}
		l.mu.Lock()
		l.gen, l.lostTo = 0, &by
		l.mu.Unlock()
		return &LostError{By: by}
	}
	l.mu.Lock()
	l.gen, l.renewed = n+1, start
	l.mu.Unlock()
	l.drop(ctx, gens, n+1)
	return nil
}

// Release deletes the lock held, so that the next agent starts at once.
// Call it once nothing deletes any more; Held fails after it.
func (l *AgentLock) Release() {
	l.mu.Lock()
	n := l.gen
	l.gen = 0
	l.mu.Unlock()
	if n == 0 {
		return
	}
	ctx, cancel := l.ctx(context.Background())
	defer cancel()
	if err := l.store.Delete(ctx, leases.Lease{ID: lockID(n)}); err != nil && !errdefs.IsNotFound(err) {
		l.o.Log.Warn().Err(err).Msg("cannot release containerd's agent lock: the next agent takes it when it finds this one gone")
		return
	}
	l.o.Log.Info().Msg("containerd's agent lock released")
}
