package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/gcagent/gcagent/events"
)

// Held returns nil while this agent may delete: it holds the lock, a
// holder it took over has stopped (on its clock and its timers), and the
// first attempt that may have made its generation began less than two
// periods ago. Else an error wrapping ErrNotHeld that says why.
func (l *AgentLock) Held() error {
	now := l.o.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.gen == 0 && l.lostTo != nil:
		return fmt.Errorf("%w: taken over by %s", ErrNotHeld, l.lostTo)
	case l.gen == 0:
		return fmt.Errorf("%w: not taken yet", ErrNotHeld)
	case l.waiting(now):
		return fmt.Errorf("%w: the agent it took over may delete for %s more", ErrNotHeld,
			max(l.notBefore.Sub(now), 0).Round(time.Second))
	case now.Sub(l.renewed) >= l.holdFor():
		return fmt.Errorf("%w: not renewed for %s (containerd does not answer)", ErrNotHeld, now.Sub(l.renewed).Round(time.Second))
	}
	return nil
}

// Hold returns the context of one delete call, checked right before it:
// ctx, ended when this agent's hold ends (its deadline is on Go's
// monotonic clock, which gRPC reads when it sends: a call sent after it,
// a process frozen in between, is refused before it leaves), and done,
// to call once the call returned. It fails as Held does, with ctx
// itself. A call cut off by its context may still be applied by
// containerd: Release waits a period after one before it lets the next
// agent start at once.
func (l *AgentLock) Hold(ctx context.Context) (call context.Context, done context.CancelFunc, err error) {
	t0 := time.Now() // before the lock's clock is read: a delay in between shortens the hold
	if err := l.Held(); err != nil {
		return ctx, func() {}, err
	}
	now := l.o.Clock.Now()
	l.mu.Lock()
	left := l.renewed.Add(l.holdFor()).Sub(now)
	l.mu.Unlock()
	call, cancel := context.WithDeadlineCause(ctx, t0.Add(left), fmt.Errorf("%w: its hold ended during the call", ErrNotHeld))
	return call, func() {
		if call.Err() != nil {
			l.cutOff()
		}
		cancel()
	}, nil
}

// cutOff notes that a delete call's context ended before the call
// returned: containerd may still apply it for a period.
func (l *AgentLock) cutOff() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.landing == nil {
		l.landing = l.o.Clock.NewTimer(l.o.Period)
	} else {
		l.landing.Reset(l.o.Period)
	}
	l.landPend = true
}

// waitFor arms a take-over wait of d from now, on the clock and on a
// timer: this agent deletes nothing until both are over.
func (l *AgentLock) waitFor(d time.Duration) {
	now := l.o.Clock.Now()
	t := l.o.Clock.NewTimer(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if end := now.Add(d); end.After(l.notBefore) {
		l.notBefore = end
	}
	l.waits = append(l.waits, t)
}

// waiting reports whether a take-over wait is not over at now; l.mu is
// held.
func (l *AgentLock) waiting(now time.Time) bool {
	left := l.waits[:0]
	for _, t := range l.waits {
		select {
		case <-t.C():
		default:
			left = append(left, t)
		}
	}
	clear(l.waits[len(left):])
	l.waits = left
	return len(l.waits) > 0 || now.Before(l.notBefore)
}

// waitLeft is how long the take-over waits have left on the clock.
func (l *AgentLock) waitLeft() time.Duration {
	now := l.o.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, l.notBefore.Sub(now))
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
// and Held fails meanwhile once two periods have passed since the first
// attempt that may have made the generation held.
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
// agent that then renewed past it) and drops the ones below. A renewal
// whose answer was lost is confirmed by a later one, and counts from the
// first attempt.
func (l *AgentLock) renew(ctx context.Context) error {
	l.mu.Lock()
	n := l.gen
	l.mu.Unlock()
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
	l.confirm(n + 1)
	l.drop(ctx, gens, n+1)
	return nil
}

// Release deletes the lock held, so that the next agent starts at once.
// Call it once nothing deletes any more; Held fails after it. It records
// its generation, and a recent take-over of its own, in the namespace's
// labels first: the next holder goes on past it, and waits what is left
// of that take-over's wait (without a label store it leaves the lock
// while an agent it took over may still delete: the next agent takes the
// wait over from its lease). After a delete call was cut off it waits a
// period first (containerd may still apply it).
func (l *AgentLock) Release() {
	now := l.o.Clock.Now()
	l.mu.Lock()
	n := l.gen
	l.gen = 0
	last := n // the highest generation this run may have made
	for k := range l.tries {
		last = max(last, k)
	}
	waiting, tookOver := l.waiting(now), l.tookOver
	var landing <-chan time.Time
	if l.landPend {
		select {
		case <-l.landing.C(): // a period has passed since the last cut-off
		default:
			landing = l.landing.C()
		}
		l.landPend = false
	}
	l.mu.Unlock()
	if n == 0 {
		return
	}
	ls, labels := l.store.(labelStore)
	if waiting && !labels {
		l.o.Log.Info().Msg("containerd's agent lock left, not released: the agent it took over may still delete; the next agent waits for it")
		return
	}
	if landing != nil {
		l.o.Log.Info().Float64("within_s", l.o.Period.Seconds()).
			Msg("a delete call was cut off and containerd may still apply it: releasing containerd's agent lock after that")
		<-landing
	}
	// The generation recorded first (a create of n+1 this run sent may
	// still land): the next holder goes on past it, so no lock id is ever
	// made twice; and a recent take-over, whose wait it takes on.
	var old []string
	if labels {
		r, _ := l.lastReleased(context.Background())
		old = r.keys
		value := releasedPlain
		if ago := l.o.Clock.Now().Sub(tookOver); !tookOver.IsZero() && ago < l.recentTakeOver() {
			value = strconv.FormatFloat(max(0, ago).Seconds(), 'f', 3, 64)
		}
		ctx, cancel := l.ctx(context.Background())
		err := ls.SetLabel(ctx, events.AgentNamespace, lockLabelReleased+strconv.FormatUint(last, 10), value)
		cancel()
		if err != nil {
			l.o.Log.Warn().Err(err).Msg("cannot release containerd's agent lock: the next agent takes it when it finds this one gone")
			return
		}
	}
	ctx, cancel := l.ctx(context.Background())
	defer cancel()
	if err := l.store.Delete(ctx, leases.Lease{ID: lockID(n)}); err != nil && !errdefs.IsNotFound(err) {
		l.o.Log.Warn().Err(err).Msg("cannot release containerd's agent lock: the next agent takes it when it finds this one gone")
		return
	}
	for _, k := range old {
		if n, _ := strconv.ParseUint(strings.TrimPrefix(k, lockLabelReleased), 10, 64); n < last {
			cctx, cancel := l.ctx(context.Background())
			_ = ls.SetLabel(cctx, events.AgentNamespace, k, "") // best effort: the highest counts
			cancel()
		}
	}
	l.o.Log.Info().Msg("containerd's agent lock released")
}
