package gc

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/projection"
)

var (
	_ containerState = (*projection.Live)(nil)
)

// guard bounds every wait on the code under test; nothing sleeps.
const guard = 5 * time.Second

// waitArmed waits until Run armed its timer at want (zero: stopped) and
// left it so; it returns once the latest report equals want.
func waitArmed(t *testing.T, c *clock.Fake, want time.Time) {
	t.Helper()
	deadline := time.After(guard)
	for {
		select {
		case got := <-c.Arms():
			if got.At.Equal(want) && len(c.Arms()) == 0 {
				return
			}
		case <-deadline:
			t.Fatalf("timer not armed at %v", want)
		}
	}
}

func waitDeleted(t *testing.T, f *fakeContainerRuntime, want ...string) {
	t.Helper()
	deadline := time.After(guard)
	var got []string
	for len(got) < len(want) {
		select {
		case id := <-f.deleted:
			got = append(got, id)
		case <-deadline:
			t.Fatalf("deleted %v, want %v; calls %v", got, want, f.Calls())
		}
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("deleted %v, want %v", got, want)
	}
}

func noMoreDeletes(t *testing.T, f *fakeContainerRuntime) {
	t.Helper()
	select {
	case id := <-f.deleted:
		t.Fatalf("unexpected delete of %s", id)
	default:
	}
}

type gcHarness struct {
	live  *projection.Live
	clock *clock.Fake
	rt    *fakeContainerRuntime
	pub   *fakePublisher
	gc    *ContainerGC
}

// startGC runs a ContainerGC over a real projection.Live, a fake clock at
// t0 and a fake runtime; it waits for the first pass to have armed the timer.
func startGC(t *testing.T, p ContainerPolicy, evs ...events.Event) *gcHarness {
	t.Helper()
	return startGCWith(t, ContainerGCOptions{Policy: p}, evs...)
}

// startGCWith is startGC with more options (its Clock and Publisher are
// the harness's).
func startGCWith(t *testing.T, opts ContainerGCOptions, evs ...events.Event) *gcHarness {
	t.Helper()
	return startGCPods(t, opts, nil, evs...)
}

// podLogDirs is a PodLogDir, read (known), whose pods' dirs were seen
// and stay until remove: the kubelet makes a pod's dir before its sandbox
// runs (a running pod whose dir goes makes the deleted-pod sign
// unreadable).
type podLogDirs struct{ removed atomic.Bool }

func (d *podLogDirs) Input(time.Time) Input { return KnownInput(t0) }
func (d *podLogDirs) Gone(_, _, _ string) (time.Time, bool) {
	return t0, d.removed.Load()
}
func (d *podLogDirs) remove() { d.removed.Store(true) }

// startGCPods is startGCWith reading the pod log dir dir.
func startGCPods(t *testing.T, opts ContainerGCOptions, dir PodLogDir, evs ...events.Event) *gcHarness {
	t.Helper()
	h := &gcHarness{clock: clock.NewFake(t0), rt: newFakeContainerRuntime(), pub: &fakePublisher{published: make(chan Action, 100)}}
	live, err := projection.NewLive(projection.LiveOptions{Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.live = live
	changes := live.Subscribe()
	live.Apply(evs...)
	opts.Clock = h.clock
	d := ContainerGCDeps{State: live, Changes: changes, Runtime: h.rt, Publisher: h.pub, PodLogDir: dir}
	if !opts.DryRun {
		d.Deletes = testDeletes1(t, h.pub, h.rt)
	}
	h.gc, err = NewContainerGC(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	runLoop(t, h.gc.Run)
	return h
}

// apply feeds events to the projection as the event source would.
func (h *gcHarness) apply(evs ...events.Event) { h.live.Apply(evs...) }

var nativePolicy = ContainerPolicy{MinAge: 10 * time.Second, MaxPerEvictUnit: 0, MaxContainers: -1, Prune: PruneNative}

// TestContainerGCTimerAtTTL: one timer, armed at the earliest TTL expiry
// and re-armed on every change; each container goes exactly when its TTL
// expires, not a step earlier.
func TestContainerGCTimerAtTTL(t *testing.T) {
	h := startGC(t, nativePolicy, flat(
		native(0, "a", "img"), start(0, "a"),
		native(0, "run", "img"), start(0, "run"),
		native(0, "never", "img"),
		events.Synced{At: t0},
	)...)
	waitArmed(t, h.clock, time.Time{}) // nothing dead: no timer

	h.apply(gone(0, "a")) // a exits at t0 and its client collects it: eligible at t0+10s
	waitArmed(t, h.clock, at(10*time.Second))
	if n := h.clock.Step(5 * time.Second); n != 0 {
		t.Fatalf("%d timers fired 5s before the TTL", n)
	}
	h.apply(native(5*time.Second, "b", "img"), start(5*time.Second, "b"), gone(5*time.Second, "b"))
	waitArmed(t, h.clock, at(10*time.Second)) // b at t0+15s does not move the earlier deadline
	noMoreDeletes(t, h.rt)

	if n := h.clock.Step(5*time.Second - time.Nanosecond); n != 0 {
		t.Fatalf("timer fired 1ns before the TTL")
	}
	h.clock.Step(time.Nanosecond)
	waitDeleted(t, h.rt, "a")
	waitArmed(t, h.clock, at(15*time.Second)) // re-armed for b
	h.clock.Step(5 * time.Second)
	waitDeleted(t, h.rt, "b")
	waitArmed(t, h.clock, time.Time{})
	if h.clock.Timers() != 1 {
		t.Errorf("%d timers created, want one re-armed timer", h.clock.Timers())
	}
	for _, c := range h.rt.Calls() {
		if c == "native-liveness run" || c == "native-liveness never" {
			t.Errorf("the running or never-started container was considered: %v", h.rt.Calls())
		}
	}
	if st := h.gc.Status(); st.Removed != 2 || !st.Synced {
		t.Errorf("status %+v", st)
	}
}

// TestContainerGCZeroTTLOnExit: with MinAge 0 the collect event alone
// removes the container once its client is quiet; the clock never moves.
func TestContainerGCZeroTTLOnExit(t *testing.T) {
	p := nativePolicy
	p.MinAge = 0
	h := startGC(t, p, flat(native(-2*time.Second, "a", "img"), start(-2*time.Second, "a"), events.Synced{At: t0})...)
	waitArmed(t, h.clock, time.Time{})
	h.apply(gone(-time.Second, "a"))
	waitDeleted(t, h.rt, "a")
	select {
	case a := <-h.pub.published:
		if a.Key != ContainerRemovalKey("a", at(-time.Second)) || a.Kind != "container" || a.Action != "removed" {
			t.Errorf("action %+v", a)
		}
	case <-time.After(guard):
		t.Fatal("removal not published")
	}
}

// TestContainerGCWaitsForSync: nothing is touched before the projection is
// synced, then the pass runs on the Synced change.
func TestContainerGCWaitsForSync(t *testing.T) {
	p := nativePolicy
	p.MinAge = 0
	h := startGC(t, p, native(-2*time.Second, "a", "img"), start(-2*time.Second, "a"), gone(-time.Second, "a"))
	waitArmed(t, h.clock, time.Time{})
	h.apply(native(-2*time.Second, "b", "img"), start(-2*time.Second, "b"), gone(-time.Second, "b"))
	waitArmed(t, h.clock, time.Time{})
	if c := h.rt.Calls(); len(c) != 0 {
		t.Fatalf("runtime called before sync: %v", c)
	}
	h.apply(events.Synced{At: t0})
	waitDeleted(t, h.rt, "a", "b")
}

// TestContainerGCRetriesFailedDeletes: a failed delete is retried by the
// same timer after a backoff, and a flood of changes does not hammer it.
func TestContainerGCRetriesFailedDeletes(t *testing.T) {
	p := nativePolicy
	p.MinAge = 0
	h := startGC(t, p, flat(native(-2*time.Second, "a", "img"), start(-2*time.Second, "a"), events.Synced{At: t0})...)
	waitArmed(t, h.clock, time.Time{})
	h.rt.InjectError("delete-native", "a", errors.New("containerd busy"))
	h.apply(gone(-time.Second, "a"))
	waitArmed(t, h.clock, at(time.Second))
	h.apply(native(0, "other", "img")) // a change before the backoff: a is not retried
	waitArmed(t, h.clock, at(time.Second))
	if n := countCalls(h.rt, "delete-native a"); n != 1 {
		t.Fatalf("%d delete attempts before the backoff", n)
	}
	h.clock.Step(time.Second)
	waitDeleted(t, h.rt, "a")
	if st := h.gc.Status(); st.Error != "" {
		t.Errorf("error after the retry: %s", st.Error)
	}
}

func countCalls(f *fakeContainerRuntime, prefix string) int {
	n := 0
	for _, c := range f.Calls() {
		if len(c) >= len(prefix) && c[:len(prefix)] == prefix {
			n++
		}
	}
	return n
}

// TestContainerGCPruneOff: off deletes nothing and arms nothing.
func TestContainerGCPruneOff(t *testing.T) {
	p := nativePolicy
	p.MinAge, p.Prune = 0, PruneOff
	h := startGC(t, p, flat(dead(0, time.Second, "a", "img"), events.Synced{At: t0})...)
	if plan, ok := h.gc.Plan(); !ok || len(plan.Remove) != 0 {
		t.Errorf("plan %+v", plan)
	}
	h.apply(dead(0, time.Second, "b", "img")...)
	if c := h.rt.Calls(); len(c) != 0 || h.clock.Timers() != 0 {
		t.Errorf("prune off: calls %v, timers %d", c, h.clock.Timers())
	}
}

// TestContainerGCCRIOnlyUnderAll: native mode leaves CRI containers alone,
// all removes them and then the emptied, exited sandbox, through CRI.
func TestContainerGCCRIOnlyUnderAll(t *testing.T) {
	evs := flat(
		sandbox(0, "sb", "u"), start(0, "sb"),
		criDead(-2*time.Second, time.Second, "c1", "img", "u", "app", "sb"),
		events.Synced{At: t0},
	)
	for _, mode := range []PruneMode{PruneNative, PruneAll} {
		t.Run(string(mode), func(t *testing.T) {
			p := ContainerPolicy{MaxPerEvictUnit: 0, MaxContainers: -1, Prune: mode}
			dirs := &podLogDirs{}
			h := startGCPods(t, ContainerGCOptions{Policy: p}, dirs, evs...)
			waitArmed(t, h.clock, time.Time{})
			if mode == PruneNative {
				if c := h.rt.Calls(); len(c) != 0 {
					t.Fatalf("native mode touched CRI: %v", c)
				}
				return
			}
			waitDeleted(t, h.rt, "c1")
			dirs.remove()
			h.apply(exit(0, "sb"), remove(0, "c1"))
			waitDeleted(t, h.rt, "sb")
			want := []string{"cri-remove c1", "sandbox-remove sb"}
			if got := h.rt.Deletes(); !slices.Equal(got, want) {
				t.Errorf("deletes %v, want %v", got, want)
			}
		})
	}
}

// TestContainerGCRechecksWhenTheRuntimeLags: CRI may still call a
// container running (a sandbox ready) right after its exit event; no
// other event need follow, so the timer looks again shortly.
func TestContainerGCRechecksWhenTheRuntimeLags(t *testing.T) {
	p := ContainerPolicy{MaxPerEvictUnit: 0, MaxContainers: -1, Prune: PruneAll}
	dirs := &podLogDirs{}
	h := startGCPods(t, ContainerGCOptions{Policy: p}, dirs, flat(sandbox(0, "sb", "u"), start(0, "sb"), events.Synced{At: t0})...)
	waitArmed(t, h.clock, time.Time{})
	h.rt.Set("sb", LiveRunning)
	dirs.remove()
	h.apply(exit(0, "sb"))
	waitArmed(t, h.clock, at(keptRetry))
	h.rt.Set("sb", LiveDead)
	h.clock.Step(keptRetry)
	waitDeleted(t, h.rt, "sb")
	waitArmed(t, h.clock, time.Time{})
}

// TestContainerGCMinGap: a change right after a pass waits for the gap's
// end (one pass then covers every change since); a lone change later is
// planned at once.
func TestContainerGCMinGap(t *testing.T) {
	p := nativePolicy
	p.MinAge = 0
	const gap = 50 * time.Millisecond
	h := startGCWith(t, ContainerGCOptions{Policy: p, MinGap: gap}, flat(
		native(-2*time.Second, "a", "img"), start(-2*time.Second, "a"),
		native(-2*time.Second, "b", "img"), start(-2*time.Second, "b"),
		native(-2*time.Second, "c", "img"), start(-2*time.Second, "c"),
		events.Synced{At: t0})...)
	// A pass at t0 (the start): the clock stays there, so both exits
	// below come within the gap and wait for its end.
	wait.Until(t, guard, "no first pass", func() bool { return h.gc.Status().Passes > 0 })
	h.apply(gone(-time.Second, "a"))
	h.apply(gone(-time.Second, "b"))
	waitArmed(t, h.clock, at(gap))
	noMoreDeletes(t, h.rt)
	h.clock.Step(gap)
	waitDeleted(t, h.rt, "a", "b")
	h.clock.Step(time.Second)
	h.apply(gone(-time.Second, "c"))
	waitDeleted(t, h.rt, "c") // the clock does not move: planned at once
}
