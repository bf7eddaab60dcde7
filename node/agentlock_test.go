package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
)

// memLeases is containerd's lease store in memory: Create of an id that
// exists fails with AlreadyExists, atomically, as containerd's does.
type memLeases struct {
	mu     sync.Mutex
	leases map[string]leases.Lease
	ns     []string // the namespace of every call
	fail   error
	// loseCreates is how many next creates lose their answer: applied,
	// and the caller gets a timeout.
	loseCreates int
	// staleList, when set, is what the next List answers (a view
	// containerd took before the last changes).
	staleList []leases.Lease
}

var _ leaseStore = (*memLeases)(nil)

func newMemLeases() *memLeases { return &memLeases{leases: map[string]leases.Lease{}} }

func (m *memLeases) call(ctx context.Context) error {
	ns, _ := namespaces.Namespace(ctx)
	m.ns = append(m.ns, ns)
	return m.fail
}

func (m *memLeases) Create(ctx context.Context, opts ...leases.Opt) (leases.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call(ctx); err != nil {
		return leases.Lease{}, err
	}
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return leases.Lease{}, err
		}
	}
	if _, ok := m.leases[l.ID]; ok {
		return leases.Lease{}, fmt.Errorf("lease %q: %w", l.ID, errdefs.ErrAlreadyExists)
	}
	m.leases[l.ID] = l
	if m.loseCreates > 0 {
		m.loseCreates--
		return leases.Lease{}, fmt.Errorf("rpc error: code = DeadlineExceeded desc = %w", context.DeadlineExceeded)
	}
	return l, nil
}

func (m *memLeases) Delete(ctx context.Context, l leases.Lease, _ ...leases.DeleteOpt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call(ctx); err != nil {
		return err
	}
	if _, ok := m.leases[l.ID]; !ok {
		return errdefs.ErrNotFound
	}
	delete(m.leases, l.ID)
	return nil
}

func (m *memLeases) List(ctx context.Context, _ ...string) ([]leases.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.call(ctx); err != nil {
		return nil, err
	}
	if m.staleList != nil {
		out := m.staleList
		m.staleList = nil
		return out[:len(out):len(out)], nil
	}
	var out []leases.Lease
	for _, l := range m.leases {
		out = append(out, l)
	}
	return out, nil
}

func (m *memLeases) ids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id := range m.leases {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// agent is an AgentID of the test's boot; pidNS "" is another pid
// namespace's (its process cannot be looked at).
func agent(node, stateID, pidNS string, pid int) AgentID {
	return AgentID{Node: node, Pid: pid, StateDir: "/var/lib/" + node, StateID: stateID, BootID: "boot-1", PidNS: pidNS,
		Start: 100, Version: "test"}
}

// processes says which pids run (alive known) in the test's pid namespace.
type processes map[int]bool

func (p processes) alive(a AgentID) (bool, bool) { return p[a.Pid], true }

func newLock(store *memLeases, me AgentID, clk clock.Timers, procs processes) *AgentLock {
	return NewAgentLock(store, me, LockOptions{Period: 10 * time.Second, Clock: clk, Log: zerolog.Nop(), alive: procs.alive})
}

// TestAgentLockRefusesALiveHolder: the first agent takes the lock (a
// lease in the agents' namespace); a second one, whatever its state dir,
// refuses at once while the first's process runs, naming its node, pid
// and state dir; once the first releases it, the second takes it.
func TestAgentLockRefusesALiveHolder(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	a := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, procs)
	if err := a.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := a.Held(); err != nil {
		t.Fatalf("held: %v", err)
	}
	if got := store.ids(); !slices.Equal(got, []string{"lock.1"}) {
		t.Fatalf("leases %v, want lock.1", got)
	}
	b := newLock(store, agent("b", "sb", "pid:[1]", 2), clk, procs)
	err := b.Acquire(context.Background(), false)
	var held *HeldError
	if !errors.As(err, &held) || held.By.Node != "a" || held.By.Pid != 1 {
		t.Fatalf("second agent: %v, want a HeldError naming a", err)
	}
	for _, want := range []string{"node a", "pid 1", "state dir /var/lib/a", "--take-over"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if err := b.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the refused agent may delete: %v", err)
	}
	a.Release()
	if got := store.ids(); len(got) != 0 {
		t.Fatalf("leases after release: %v", got)
	}
	if err := b.Acquire(context.Background(), false); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	for _, ns := range store.ns {
		if ns != events.AgentNamespace {
			t.Fatalf("a call in namespace %q, want %q", ns, events.AgentNamespace)
		}
	}
}

// TestAgentLockSameInstant: agents started at the same instant on one
// containerd: exactly one takes the lock, each other refuses.
func TestAgentLockSameInstant(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{}
	const n = 8
	locks := make([]*AgentLock, n)
	for i := range locks {
		procs[i+1] = true
		locks[i] = newLock(store, agent(fmt.Sprint("n", i), fmt.Sprint("s", i), "pid:[1]", i+1), clk, procs)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, l := range locks {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = l.Acquire(context.Background(), false) }()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		var held *HeldError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &held):
			t.Errorf("agent %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d agents took the lock, want 1: %v", won, errs)
	}
}

// TestAgentLockTakesADeadHoldersLock: a holder proven to have stopped is
// taken over at once: the last run of this very state dir (kill -9, then
// a restart), a previous boot, a process gone from this pid namespace.
func TestAgentLockTakesADeadHoldersLock(t *testing.T) {
	for _, tt := range []struct {
		name string
		old  AgentID
	}{
		{"the same state dir", agent("a", "same", "", 1)},
		{"a previous boot", func() AgentID { a := agent("a", "sa", "", 1); a.BootID = "boot-0"; return a }()},
		{"its process gone", agent("a", "sa", "pid:[1]", 7)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
			old := newLock(store, tt.old, clk, processes{})
			if err := old.Acquire(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			// old is killed: it renews nothing any more.
			me := newLock(store, agent("b", "same", "pid:[1]", 2), clk, processes{2: true})
			if err := me.Acquire(context.Background(), false); err != nil {
				t.Fatalf("took nothing: %v", err)
			}
			if got := store.ids(); !slices.Equal(got, []string{"lock.2"}) {
				t.Errorf("leases %v, want lock.2 only", got)
			}
			if err := me.Held(); err != nil {
				t.Errorf("held: %v", err)
			}
		})
	}
}

// stepWhile moves clk to each next deadline the loops under test arm, as
// they arm them, while cond holds: their timers fire in order, however
// slowly the loops run.
func stepWhile(t *testing.T, clk *clock.Fake, cond func() bool) {
	t.Helper()
	pending := map[int]time.Time{}
	note := func(a clock.Arm) {
		if a.At.IsZero() {
			delete(pending, a.Timer)
		} else {
			pending[a.Timer] = a.At
		}
	}
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond) // to look at cond again
	defer tick.Stop()
	for cond() {
		for drained := false; !drained; {
			select {
			case a := <-clk.Arms():
				note(a)
			default:
				drained = true
			}
		}
		next, id := time.Time{}, -1
		for i, at := range pending {
			if id < 0 || at.Before(next) {
				next, id = at, i
			}
		}
		if id >= 0 {
			delete(pending, id)
			clk.Step(max(0, next.Sub(clk.Now())))
			continue
		}
		select {
		case a := <-clk.Arms():
			note(a)
		case <-tick.C:
		case <-deadline:
			t.Fatal("the lock's loops did not get there")
		}
	}
}

// running reports whether done is still open.
func running(done <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
}

// TestAgentLockWatchesAHolderItCannotSee: a holder in another pid
// namespace (a DaemonSet pod beside a systemd unit) is watched: one that
// renews is refused; one that renews nothing for three periods of this
// agent's own clock is taken over, and may no longer delete by then.
func TestAgentLockWatchesAHolderItCannotSee(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	holder := newLock(store, agent("pod", "sp", "pid:[2]", 1), clk, processes{})
	if err := holder.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	me := newLock(store, agent("unit", "su", "pid:[1]", 1), clk, processes{})
	var err error
	done := make(chan struct{})
	go func() { err = me.Acquire(context.Background(), false); close(done) }()
	poll := <-clk.Arms() // the watch's first poll is armed
	if err := holder.renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Step(poll.At.Sub(clk.Now()))
	stepWhile(t, clk, running(done))
	var held *HeldError
	if !errors.As(err, &held) || held.By.Node != "pod" {
		t.Fatalf("beside a holder that renews: %v, want a HeldError naming it", err)
	}

	// The holder hangs or dies: no more renewals, no release.
	done = make(chan struct{})
	began := clk.Now()
	go func() { err = me.Acquire(context.Background(), false); close(done) }()
	stepWhile(t, clk, running(done))
	if err != nil {
		t.Fatalf("after the holder stopped renewing: %v", err)
	}
	if waited := clk.Now().Sub(began); waited < 30*time.Second {
		t.Errorf("took the lock after %s, before three periods (30s) without a renewal", waited)
	}
	if err := holder.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the silent holder may still delete: %v", err)
	}
	if err := me.Held(); err != nil {
		t.Errorf("held: %v", err)
	}
}

// TestAgentLockTakeOver: --take-over takes the lock from a live holder;
// the taker deletes nothing for two periods, and the holder learns at its
// next renewal that it lost the lock (it must stop) and names the taker.
func TestAgentLockTakeOver(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	old := newLock(store, agent("old", "so", "pid:[1]", 1), clk, procs)
	if err := old.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	me := newLock(store, agent("new", "sn", "pid:[1]", 2), clk, procs)
	if err := me.Acquire(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if err := me.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the taker may delete at once: %v", err)
	}
	lost := make(chan error, 1)
	go func() { lost <- old.Run(context.Background()) }()
	done := make(chan struct{})
	go func() {
		err := <-lost
		var l *LostError
		if !errors.As(err, &l) || l.By.Node != "new" {
			t.Errorf("the holder taken over: %v, want a LostError naming new", err)
		}
		close(done)
	}()
	stepWhile(t, clk, running(done))
	if err := old.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the holder taken over may still delete: %v", err)
	}
	clk.Step(20 * time.Second)
	if err := me.Held(); err == nil {
		t.Errorf("held without a renewal for two periods")
	}
}

// TestAgentLockHeldNeedsRenewals: a holder whose renewals containerd does
// not answer stops deleting two periods after the last one began, and
// deletes again once one succeeds, which HeldAgain tells.
func TestAgentLockHeldNeedsRenewals(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	l := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, processes{1: true})
	if err := l.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.fail = errors.New("connection refused")
	store.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = l.Run(ctx) }()
	stepWhile(t, clk, func() bool { return l.Held() == nil })
	if d := clk.Now().Sub(time.Unix(1000, 0)); d < 20*time.Second {
		t.Errorf("not held after %s, before two periods", d)
	}
	again := l.HeldAgain()
	select {
	case <-again:
		t.Fatal("HeldAgain closed while renewals fail")
	default:
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	stepWhile(t, clk, func() bool { return l.Held() != nil })
	select { // Run closes it just after the renewal Held sees
	case <-again:
	case <-time.After(10 * time.Second):
		t.Error("held again, but HeldAgain's channel is open: a refused pass is not tried again")
	}
	if l.HeldAgain() == again {
		t.Error("HeldAgain returns the closed channel again")
	}
}

// TestAgentLockLeasesDeletedByHand: the lock's leases deleted by hand (ctr
// leases rm) while an agent holds it, and another agent starting then:
// both hold a generation for at most one renewal, then the one whose
// generation is lower learns that it lost the lock and stops.
func TestAgentLockLeasesDeletedByHand(t *testing.T) {
	store, clk := newMemLeases(), clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	a := newLock(store, agent("a", "sa", "pid:[1]", 1), clk, procs)
	if err := a.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := a.renew(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	store.mu.Lock()
	clear(store.leases)
	store.mu.Unlock()
	b := newLock(store, agent("b", "sb", "pid:[1]", 2), clk, procs)
	if err := b.Acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := a.renew(context.Background()); err != nil {
		t.Fatalf("the agent with the higher generation: %v", err)
	}
	err := b.renew(context.Background())
	var lost *LostError
	if !errors.As(err, &lost) || lost.By.Node != "a" {
		t.Fatalf("the agent with the lower generation: %v, want a LostError naming a", err)
	}
	if err := b.Held(); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the agent that lost may still delete: %v", err)
	}
	if err := a.Held(); err != nil {
		t.Errorf("the holder: %v", err)
	}
}
