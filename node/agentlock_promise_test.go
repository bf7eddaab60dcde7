package node

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"

	"github.com/gcagent/gcagent/internal/clock"
)

// The lock's promise, case by case: each test is one schedule the model
// test (agentlock_model_test.go) finds among its random ones, pinned.

func (m *memLeases) loseNextCreate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loseCreates++
}

// TestAgentLockTakeOverAfterALostAnswer: a --take-over whose first create
// reached containerd but whose answer was lost finds, when it tries
// again, that lease as its own: it still waits before it deletes, as the
// attempt that made it would have.
func TestAgentLockTakeOverAfterALostAnswer(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	old := newLock(store, agent("old", "so", "pid:[1]", 1), clk, procs)
	if err := old.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	me := newLock(store, agent("new", "sn", "pid:[1]", 2), clk, procs)
	store.loseNextCreate()
	if err := me.Acquire(context.Background(), true); err == nil {
		t.Fatal("the take-over whose answer was lost took the lock")
	}
	clk.Step(time.Second)
	if err := me.Acquire(context.Background(), true); err != nil {
		t.Fatalf("trying again: %v", err)
	}
	if err := me.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the taker may delete at once after a lost answer: %v", err)
	}
	// The holder taken over may delete until its hold ends: 20 s after
	// its renewal began (1000 s); the taker waits until 30 s after its
	// first attempt (also 1000 s).
	clk.Step(25 * time.Second)
	if err := me.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the taker may delete 26 s after its take-over began: %v", err)
	}
}

// TestAgentLockRenewalCountsFromItsFirstAttempt: a renewal whose create
// reached containerd but whose answer was lost, confirmed by a later
// attempt, counts from the first attempt (when the lease may have
// appeared, and another agent may have started counting), not from the
// one that confirmed it.
func TestAgentLockRenewalCountsFromItsFirstAttempt(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	l := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, processes{1: true})
	if err := l.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Second) // 1010: the renewal; its answer is lost
	store.loseNextCreate()
	if err := l.renew(context.Background()); err == nil {
		t.Fatal("a renewal whose answer was lost succeeded")
	}
	clk.Step(7 * time.Second) // 1017: tried again, it finds lock.2 its own
	if err := l.renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := store.ids(); !slices.Equal(got, []string{"lock.2"}) {
		t.Fatalf("leases %v, want lock.2", got)
	}
	clk.Step(13 * time.Second) // 1030: 20 s after the first attempt
	if err := l.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("held 20 s after the renewal that made lock.2 began: %v", err)
	}
}

// TestAgentLockSecondTakeOverRefused: two agents started with
// --take-over do not take the lock from each other for ever: the second
// is refused while the holder took over within the last 5 minutes (its
// leases say so), with a line that says when it may be tried again, and
// takes it over after that.
func TestAgentLockSecondTakeOverRefused(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true, 3: true}
	x := newLock(store, agent("x", "sx", "pid:[1]", 1), clk, procs)
	if err := x.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	a := newLock(store, agent("a", "sa", "pid:[1]", 2), clk, procs)
	if err := a.Acquire(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Minute)
	b := newLock(store, agent("b", "sb", "pid:[1]", 3), clk, procs)
	err := b.Acquire(context.Background(), true)
	var held *HeldError
	if !errors.As(err, &held) || held.By.Node != "a" {
		t.Fatalf("a second --take-over a minute after the first: %v, want refused naming a", err)
	}
	for _, want := range []string{"node a", "took containerd over itself recently", "--take-over is refused for up to 5m0s more", "start this one again then"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := b.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the refused agent may delete: %v", err)
	}

	// a renews for five minutes; then a --take-over takes it.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	end := clk.Now().Add(5 * time.Minute)
	stepWhile(t, clk, func() bool { return clk.Now().Before(end) })
	cancel()
	<-done
	if err := b.Acquire(context.Background(), true); err != nil {
		t.Fatalf("--take-over 6 minutes after the holder took over: %v", err)
	}
	if err := b.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the second taker may delete at once: %v", err)
	}
}

// TestAgentLockTakesTheWaitOfADeadTaker: an agent that took over and died
// within its wait (kill -9) leaves that wait to whoever takes the lock
// from it at once: its restart on the same state dir, an agent that finds
// its process gone. Both wait what is left of it.
func TestAgentLockTakesTheWaitOfADeadTaker(t *testing.T) {
	for _, tt := range []struct {
		name string
		next AgentID
	}{
		{"its restart", agent("t", "st", "pid:[1]", 4)},
		{"an agent finding its process gone", agent("c", "sc", "pid:[1]", 5)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
			procs := processes{1: true, 4: true, 5: true}
			x := newLock(store, agent("x", "sx", "pid:[1]", 1), clk, procs)
			if err := x.Acquire(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			taker := newLock(store, agent("t", "st", "pid:[1]", 2), clk, procs)
			if err := taker.Acquire(context.Background(), true); err != nil {
				t.Fatal(err)
			}
			clk.Step(time.Second) // killed; pid 2 is gone
			next := newLock(store, tt.next, clk, procs)
			if err := next.Acquire(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			if err := next.Held(); !errors.Is(err, ErrNotHeld) {
				t.Errorf("deletes at once while the agent taken over 1 s ago may still delete: %v", err)
			}
			clk.Step(28 * time.Second)
			if err := next.Held(); !errors.Is(err, ErrNotHeld) {
				t.Errorf("deletes 29 s after the take-over: %v", err)
			}
		})
	}
}

// TestAgentLockReleaseDuringItsWait: an agent that took over and stops
// within its wait releases the lock saying so in the namespace's labels
// (a store without them: leaves its lease, whose labels say so), and the
// next one waits what is left of that wait (the agent it took over may
// still delete).
func TestAgentLockReleaseDuringItsWait(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	labelled := &labelLeases{memLeases: newMemLeases(), labels: map[string]string{}}
	for name, ls := range map[string]leaseStore{"without labels": store, "with labels": labelled} {
		t.Run(name, func(t *testing.T) { releaseDuringItsWait(t, ls, clk) })
	}
}

func releaseDuringItsWait(t *testing.T, store leaseStore, clk *clock.Fake) {
	ids := func() []string {
		if l, ok := store.(*labelLeases); ok {
			return l.ids()
		}
		return store.(*memLeases).ids()
	}
	procs := processes{1: true, 3: true}
	lock := func(a AgentID) *AgentLock {
		return NewAgentLock(store, a, LockOptions{Period: 10 * time.Second, Clock: clk, alive: procs.alive})
	}
	x := lock(agent("x", "sx", "pid:[1]", 1))
	if err := x.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	taker := lock(agent("t", "st", "pid:[1]", 2))
	if err := taker.Acquire(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	taker.Release()            // and pid 2 exits
	want := []string{"lock.2"} // left
	if _, ok := store.(*labelLeases); ok {
		want = nil // released
	}
	if got := ids(); !slices.Equal(got, want) {
		t.Fatalf("leases after a release within the wait %v, want %v", got, want)
	}
	next := lock(agent("c", "sc", "pid:[1]", 3))
	if err := next.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := next.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("deletes at once after a taker released within its wait: %v", err)
	}
	clk.Step(27 * time.Second) // 29 s after the take-over
	if err := next.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("deletes 29 s after the take-over it released within: %v", err)
	}
}

// jumpClock is a Fake whose time jumps forward while its timers do not
// (a suspend, counted by CLOCK_BOOTTIME, not by Go's timers).
type jumpClock struct {
	*clock.Fake
	mu   sync.Mutex
	jump time.Duration
}

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Fake.Now().Add(c.jump)
}

// TestAgentLockWatchCountsOnItsTimers: a watcher whose clock steps forward
// does not take the lock early: it waits three periods on its timers too.
func TestAgentLockWatchCountsOnItsTimers(t *testing.T) {
	store, fake := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	holder := newLock(store, agent("pod", "sp", "pid:[2]", 1), fake, processes{})
	if err := holder.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	clk := &jumpClock{Fake: fake}
	me := newLock(store, agent("unit", "su", "pid:[1]", 1), clk, processes{})
	done := make(chan struct{})
	var err error
	go func() { err = me.Acquire(context.Background(), false); close(done) }()
	poll := <-fake.Arms() // the watch's first poll is armed
	clk.mu.Lock()
	clk.jump = time.Minute
	clk.mu.Unlock()
	fake.Step(poll.At.Sub(fake.Now()))
	began := poll.At.Add(-2 * time.Second)
	stepWhile(t, fake, running(done))
	if err != nil {
		t.Fatal(err)
	}
	if waited := fake.Now().Sub(began); waited < 30*time.Second {
		t.Errorf("took the lock after %s of its timers, before three periods (30s): its clock stepped a minute forward", waited)
	}
}

// TestAgentLockCreateThatLandsBelowTheTop: a create that containerd
// applies after the id was made and dropped (the lock went on above it,
// the agent's list was older) does not hold the lock.
func TestAgentLockCreateThatLandsBelowTheTop(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	a := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, procs)
	if err := a.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := a.renew(context.Background()); err != nil { // lock.2; lock.1 dropped
		t.Fatal(err)
	}
	store.mu.Lock()
	store.staleList = []leases.Lease{} // b's list saw no lease
	store.mu.Unlock()
	b := newLock(store, agent("b", "sb", "pid:[1]", 2), clk, procs)
	err := b.Acquire(context.Background(), false)
	var held *HeldError
	if !errors.As(err, &held) || held.By.Node != "a" {
		t.Errorf("an agent whose lock.1 landed below a's lock.2: %v, want refused naming a", err)
	}
	if err := b.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("holds a lease below the top: %v", err)
	}
}

// labelLeases is memLeases with the namespace's labels.
type labelLeases struct {
	*memLeases
	labels map[string]string
}

var _ labelStore = (*labelLeases)(nil)

func (m *labelLeases) Labels(context.Context, string) (map[string]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for k, v := range m.labels {
		out[k] = v
	}
	return out, nil
}

func (m *labelLeases) SetLabel(_ context.Context, _, key, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if value == "" {
		delete(m.labels, key)
	} else {
		m.labels[key] = value
	}
	return nil
}

// TestAgentLockGenerationsGoOnAfterARelease: a release records its
// generation in the lock namespace's labels, and the next holder goes on
// past it (and past a renewal the releaser may have sent), so no lock id
// is made twice: a delete or a create containerd applies late cannot hit
// the new holder's lease.
func TestAgentLockGenerationsGoOnAfterARelease(t *testing.T) {
	store := &labelLeases{memLeases: newMemLeases(), labels: map[string]string{}}
	clk := clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	a := NewAgentLock(store, agent("a", "sa", "pid:[1]", 1), LockOptions{Period: 10 * time.Second, Clock: clk, alive: procs.alive})
	if err := a.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.renew(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a.Release()
	if got := store.ids(); len(got) != 0 {
		t.Fatalf("leases after the release: %v", got)
	}
	if want := map[string]string{lockLabelReleased + "3": releasedPlain}; !maps.Equal(store.labels, want) {
		t.Errorf("namespace labels %v, want %v", store.labels, want)
	}
	b := NewAgentLock(store, agent("b", "sb", "pid:[1]", 2), LockOptions{Period: 10 * time.Second, Clock: clk, alive: procs.alive})
	if err := b.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if got := store.ids(); !slices.Equal(got, []string{"lock.5"}) {
		t.Errorf("leases after the next take %v, want lock.5", got)
	}
	b.Release()
	if want := map[string]string{lockLabelReleased + "5": releasedPlain}; !maps.Equal(store.labels, want) {
		t.Errorf("namespace labels %v, want only the last release's %v", store.labels, want)
	}
}

// TestAgentLockHoldBoundsTheCall: Hold gives a delete call a context that
// ends when the hold does (two periods after the renewal began), and
// refuses once it has ended; a call cut off by its context makes Release
// wait a period before it lets the next agent start at once.
func TestAgentLockHoldBoundsTheCall(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	l := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, processes{1: true})
	if err := l.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	clk.Step(15 * time.Second)
	before := time.Now()
	call, done, err := l.Hold(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dl, ok := call.Deadline()
	if left := dl.Sub(before); !ok || left > 5*time.Second+time.Second/10 || left < 4*time.Second {
		t.Errorf("the call may go for %s (deadline %v), want the 5 s left of the hold", left, ok)
	}
	done()
	clk.Step(5 * time.Second)
	if _, _, err := l.Hold(context.Background()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Hold after the hold ended: %v", err)
	}
	if err := l.renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	parent, cancel := context.WithCancel(context.Background())
	call, done, err = l.Hold(parent)
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the agent stops mid-call
	done()
	released := make(chan struct{})
	go func() { l.Release(); close(released) }()
	stepWhile(t, clk, running(released))
	if got := clk.Now().Sub(time.Unix(1020, 0)); got < 10*time.Second {
		t.Errorf("released %s after a call was cut off, want a period (10s)", got)
	}
	if got := store.ids(); len(got) != 0 {
		t.Errorf("leases after the release: %v", got)
	}
}
