package node

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/internal/clock"
)

var (
	modelSchedules = flag.Int("lockmodel.schedules", 1500, "how many random schedules TestAgentLockModel runs")
	modelSeed      = flag.Int64("lockmodel.seed", -1, "run only this schedule of TestAgentLockModel, and print its trace")
	modelMinutes   = flag.Int("lockmodel.minutes", 8, "how long each schedule of TestAgentLockModel runs, in virtual minutes")
)

// TestAgentLockModel drives two and three agents, each the real AgentLock
// code with its own clock (its own offset, and forward steps its timers
// do not see: a suspend, which CLOCK_BOOTTIME counts and Go's timers do
// not), through random, seeded schedules on the virtual time of
// testing/synctest, against a model of containerd whose lease store
// creates atomically (an id that exists fails with AlreadyExists), whose
// namespace keeps labels, and whose calls may
//   - lose their answer: applied, but the caller waits until its deadline;
//   - be slow: applied late, also after the caller's deadline (a lease
//     create, delete or list and a label write up to 40 s after it was
//     sent; a delete up to 9 s: the margin between the end of a hold and
//     the earliest delete of another agent is 10 s);
//   - fail while containerd restarts (every call, for up to 40 s; leases
//     and labels survive).
//
// Its agents may freeze (the process stops for up to 45 s and sends
// nothing meanwhile, also right between its last check and its delete
// call), be slow between their first check and the last (a settle, an
// fsync), stop cleanly (and release), be killed (kill -9: no release;
// the lock calls it sent may still land late, its deletes land by the
// time it dies), lose the lock, be refused, and start again on their
// state dir; some start with --take-over, some in a pid namespace of
// their own (the others cannot see their process). Each agent deletes as
// the executors do: Held (the delete transaction's Begin), then Hold
// right before the call, whose context the call is sent with; gRPC
// refuses a call whose deadline has passed.
//
// A delete window is the interval from the last check that allowed a
// delete (Hold returning nil) to the moment containerd applied it; a
// delete containerd never applied has none. The test fails when windows
// of two agents overlap (two state dirs: the runs of one state dir follow
// each other, its own lock between them), and prints the seed, the
// schedule's parameters and its trace up to the overlap. Run one schedule
// with -lockmodel.seed=N; it replays the same schedule (up to the order
// of trace lines at one virtual instant). Not modelled: a delete
// containerd applies after the process that sent it died, or more than
// 10 s after its deadline (docs/faults.md says what is left).
func TestAgentLockModel(t *testing.T) {
	seeds := make([]int64, 0, *modelSchedules)
	if *modelSeed >= 0 {
		seeds = append(seeds, *modelSeed)
	} else {
		n := *modelSchedules
		if testing.Short() {
			n = min(n, 200)
		}
		for i := range n {
			seeds = append(seeds, int64(i))
		}
	}
	var total modelStats
	for _, seed := range seeds {
		var w *world
		synctest.Test(t, func(t *testing.T) {
			w = newWorld(seed, time.Duration(*modelMinutes)*time.Minute)
			w.run()
		})
		total.add(w.stats)
		if o := w.overlap(); o != "" {
			t.Fatalf("seed %d (-lockmodel.seed=%d): %s\n%s\n%s", seed, seed, o, w.params(), w.traceUpTo(o))
		}
		if *modelSeed >= 0 {
			t.Logf("seed %d: %s\n%s", seed, w.params(), strings.Join(w.trace, "\n"))
		}
	}
	t.Logf("%d schedules: %s", len(seeds), total)
	if len(seeds) >= 100 {
		// The faults happened, and agents deleted through them: a model
		// that never got there would prove nothing.
		for what, n := range total.counts() {
			if n == 0 {
				t.Errorf("no %s in %d schedules: the model does not exercise it", what, len(seeds))
			}
		}
	}
}

// modelStats counts what the schedules did.
type modelStats struct {
	deletes, refused, lostAnswers, slowLands, frozenAfterCheck, restarts, steps, takeOvers, waits, lost,
	refusals, refusedTakeOvers, releases, cutOffLands, kills int
}

func (s *modelStats) add(o modelStats) {
	s.deletes += o.deletes
	s.refused += o.refused
	s.lostAnswers += o.lostAnswers
	s.slowLands += o.slowLands
	s.frozenAfterCheck += o.frozenAfterCheck
	s.restarts += o.restarts
	s.steps += o.steps
	s.takeOvers += o.takeOvers
	s.waits += o.waits
	s.lost += o.lost
	s.refusals += o.refusals
	s.refusedTakeOvers += o.refusedTakeOvers
	s.releases += o.releases
	s.cutOffLands += o.cutOffLands
	s.kills += o.kills
}

func (s modelStats) counts() map[string]int {
	return map[string]int{"delete applied": s.deletes, "delete refused by its deadline": s.refused,
		"lost answer": s.lostAnswers, "call applied after its deadline": s.slowLands,
		"freeze between the last check and the call": s.frozenAfterCheck, "containerd restart": s.restarts,
		"clock step": s.steps, "--take-over": s.takeOvers, "lost lock": s.lost, "refusal": s.refusals,
		"Release call": s.releases, "take with a wait": s.waits, "kill -9": s.kills}
}

func (s modelStats) String() string {
	return fmt.Sprintf("%d deletes applied, %d refused by their deadline (%d cut off and applied after it); "+
		"%d lost answers, %d calls applied after their deadline, %d freezes between the last check and the call, "+
		"%d containerd restarts, %d clock steps, %d kills; %d takes with a wait (%d by --take-over), %d Release calls, %d locks lost, "+
		"%d refusals (%d of a --take-over)",
		s.deletes, s.refused, s.cutOffLands, s.lostAnswers, s.slowLands, s.frozenAfterCheck, s.restarts, s.steps, s.kills,
		s.waits, s.takeOvers, s.releases, s.lost, s.refusals, s.refusedTakeOvers)
}

// world is one schedule: containerd, the agents, what happened.
type world struct {
	seed   int64
	length time.Duration
	t0     time.Time
	p      modelParams

	mu sync.Mutex
	// restarter and stepper draw the faults: one stream each (and each
	// agent's own), so that goroutines drawing at one virtual instant do
	// not change each other's draws.
	restarter, stepper *rand.Rand
	leases             map[string]leases.Lease
	nsLabels           map[string]string // the lock namespace's
	downUntil          time.Time
	procs              map[int]bool // pid: runs
	nextPid            int
	windows            []window
	inflight           sync.WaitGroup // calls not landed yet
	trace              []string
	stats              modelStats
	agents             []*modelAgent
}

// modelParams are a schedule's fault rates and agents.
type modelParams struct {
	lost, slow         float64       // per call: the answer lost; applied late
	kill               float64       // per run of a process: killed (kill -9) at a random moment
	slowBegin, freezeC float64       // per delete: slow from Held to Hold; frozen from Hold to the call
	freezeEvery        time.Duration // mean time between freezes of a process
	restartEvery       time.Duration // mean time between containerd restarts
	stepEvery          time.Duration // mean time between clock steps
}

// window is one delete's: from the check that allowed it to its landing.
type window struct {
	agent          string
	check, applied time.Time
	n              int // the trace line of its landing
}

type modelAgent struct {
	w        *world
	name     string
	stateID  string
	pidNS    string
	takeOver bool
	offset   time.Duration
	step     atomic.Int64 // forward steps of its clock so far
	rng      *rand.Rand   // its own draws (under w.mu): its runs and deletes
	freezer  *rand.Rand   // its freezes'
	// lockFates and deleteFates draw what containerd does with its
	// lock's calls (one at a time) and with its deletes.
	lockFates, deleteFates *rand.Rand
	frozen                 time.Time // its process sends nothing before (under w.mu)
	clk                    clock.Timers
}

func newWorld(seed int64, length time.Duration) *world {
	stream := func(k uint64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), k)) }
	rng := stream(0x6c6f636b)
	w := &world{seed: seed, length: length, t0: time.Now(), restarter: stream(2), stepper: stream(3), leases: map[string]leases.Lease{}, nsLabels: map[string]string{}, procs: map[int]bool{},
		nextPid: 100}
	w.p = modelParams{
		lost: rng.Float64() * 0.25, slow: rng.Float64() * 0.25, kill: rng.Float64() * 0.3,
		slowBegin: rng.Float64() * 0.1, freezeC: rng.Float64() * 0.1,
		freezeEvery:  time.Duration(30+rng.IntN(300)) * time.Second,
		restartEvery: time.Duration(60+rng.IntN(400)) * time.Second,
		stepEvery:    time.Duration(60+rng.IntN(400)) * time.Second,
	}
	n := 2 + rng.IntN(2)
	for i := range n {
		a := &modelAgent{w: w, name: fmt.Sprintf("a%d", i), stateID: fmt.Sprintf("state-%d", i), takeOver: rng.IntN(5) < 2,
			offset: time.Duration(rng.Int64N(int64(20*time.Hour))) - 10*time.Hour,
			rng:    stream(uint64(100 + i)), freezer: stream(uint64(200 + i)), lockFates: stream(uint64(300 + i)),
			deleteFates: stream(uint64(400 + i))}
		a.pidNS = "pid:[host]"
		if rng.IntN(2) == 0 {
			a.pidNS = fmt.Sprintf("pid:[%d]", i) // its own: the others cannot see its process
		}
		a.clk = clock.System(func() time.Time {
			return time.Now().Add(a.offset + time.Duration(a.step.Load())).Round(0)
		})
		w.agents = append(w.agents, a)
	}
	return w
}

func (w *world) params() string {
	var as []string
	for _, a := range w.agents {
		as = append(as, fmt.Sprintf("%s (take-over %v, %s, clock %+.0fs)", a.name, a.takeOver, a.pidNS, a.offset.Seconds()))
	}
	return fmt.Sprintf("agents %s; runs killed %.2f, answers lost %.2f, calls slow %.2f, slow from Held to Hold %.2f, frozen from Hold to the call %.2f, "+
		"a freeze every %s, a containerd restart every %s, a clock step every %s",
		strings.Join(as, ", "), w.p.kill, w.p.lost, w.p.slow, w.p.slowBegin, w.p.freezeC, w.p.freezeEvery, w.p.restartEvery, w.p.stepEvery)
}

// logf adds a line to the trace; w.mu is held.
func (w *world) logf(format string, args ...any) int {
	w.trace = append(w.trace, fmt.Sprintf("%9.3fs ", time.Since(w.t0).Seconds())+fmt.Sprintf(format, args...))
	return len(w.trace) - 1
}

func (w *world) log(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logf(format, args...)
}

// draw returns a random duration in [lo, hi) from rng; w.mu is held.
func draw(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// exp returns an exponential random duration of mean m; w.mu is held.
func exp(rng *rand.Rand, m time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(m))
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *world) run() {
	ctx, cancel := context.WithTimeout(context.Background(), w.length)
	defer cancel()
	var wg sync.WaitGroup
	for _, a := range w.agents {
		wg.Go(func() { a.life(ctx) })
		wg.Go(func() { a.freezes(ctx) })
	}
	wg.Go(func() { w.restarts(ctx) })
	wg.Go(func() { w.steps(ctx) })
	wg.Wait()
	w.inflight.Wait()
}

// restarts stops containerd now and then: every call fails meanwhile.
func (w *world) restarts(ctx context.Context) {
	for {
		w.mu.Lock()
		next, down := exp(w.restarter, w.p.restartEvery), draw(w.restarter, time.Second, 40*time.Second)
		w.mu.Unlock()
		if !sleep(ctx, next) {
			return
		}
		w.mu.Lock()
		w.downUntil = time.Now().Add(down)
		w.stats.restarts++
		w.logf("containerd restarts: down for %s", down)
		w.mu.Unlock()
	}
}

// steps moves an agent's clock (or every agent's: the host suspended)
// forward, which its timers do not see.
func (w *world) steps(ctx context.Context) {
	for {
		w.mu.Lock()
		next, d, who := exp(w.stepper, w.p.stepEvery), draw(w.stepper, time.Second, 120*time.Second), w.stepper.IntN(len(w.agents)+1)
		w.mu.Unlock()
		if !sleep(ctx, next) {
			return
		}
		w.mu.Lock()
		w.stats.steps++
		for i, a := range w.agents {
			if who == len(w.agents) || who == i {
				a.step.Add(int64(d))
			}
		}
		if who == len(w.agents) {
			w.logf("every agent's clock steps %s forward (a suspend)", d)
		} else {
			w.logf("%s's clock steps %s forward", w.agents[who].name, d)
		}
		w.mu.Unlock()
	}
}

func (w *world) alive(a AgentID) (bool, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.procs[a.Pid], true
}

// freezes stops a's process now and then.
func (a *modelAgent) freezes(ctx context.Context) {
	for {
		a.w.mu.Lock()
		next, d := exp(a.freezer, a.w.p.freezeEvery), draw(a.freezer, 100*time.Millisecond, 45*time.Second)
		a.w.mu.Unlock()
		if !sleep(ctx, next) {
			return
		}
		a.freeze(d, "")
	}
}

// freeze stops a's process for d.
func (a *modelAgent) freeze(d time.Duration, where string) {
	a.w.mu.Lock()
	defer a.w.mu.Unlock()
	if until := time.Now().Add(d); until.After(a.frozen) {
		a.frozen = until
	}
	a.w.logf("%s freezes for %s%s", a.name, d, where)
}

// gate returns once a's process runs (not frozen).
func (a *modelAgent) gate() {
	for {
		a.w.mu.Lock()
		until := a.frozen
		a.w.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return
		}
		time.Sleep(d)
	}
}

// life runs a's process, and starts it again on its state dir after it
// stopped (refused, taken over, or stopped cleanly).
func (a *modelAgent) life(ctx context.Context) {
	a.w.mu.Lock()
	start := draw(a.rng, 0, 30*time.Second)
	a.w.mu.Unlock()
	if !sleep(ctx, start) {
		return
	}
	for ctx.Err() == nil {
		a.once(ctx)
		a.w.mu.Lock()
		again := draw(a.rng, 100*time.Millisecond, 40*time.Second)
		a.w.mu.Unlock()
		if !sleep(ctx, again) {
			return
		}
	}
}

// logWriter puts the lock's log lines into the trace.
type logWriter struct {
	w    *world
	name string
}

func (l logWriter) Write(p []byte) (int, error) {
	l.w.log("%s %s", l.name, strings.TrimSpace(string(p)))
	return len(p), nil
}

// once is one run of a's process: it takes the lock as the agent does
// (Acquire, tried again while containerd does not answer), renews it and
// deletes until it stops.
func (a *modelAgent) once(ctx context.Context) {
	w := a.w
	ctx, kill := context.WithCancel(ctx)
	defer kill()
	w.mu.Lock()
	w.nextPid++
	p := &proc{pid: w.nextPid, dead: make(chan struct{})}
	w.procs[p.pid] = true
	lifetime := draw(a.rng, time.Second, 400*time.Second)
	killed, killAt := a.rng.Float64() < w.p.kill, draw(a.rng, 0, lifetime)
	w.logf("%s starts, pid %d, take-over %v", a.name, p.pid, a.takeOver)
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.procs[p.pid] {
			w.procs[p.pid] = false
			w.logf("%s pid %d exits", a.name, p.pid)
		}
		w.mu.Unlock()
	}()
	if killed {
		w.inflight.Go(func() {
			if !sleep(ctx, killAt) {
				return
			}
			w.mu.Lock()
			p.killed = true
			close(p.dead)
			w.procs[p.pid] = false
			w.stats.kills++
			w.logf("%s pid %d is killed (kill -9)", a.name, p.pid)
			w.mu.Unlock()
			kill()
		})
	}
	id := AgentID{Node: a.name, Pid: p.pid, StateDir: "/var/lib/" + a.name, StateID: a.stateID, BootID: "boot", PidNS: a.pidNS,
		Start: uint64(p.pid), Version: "model"}
	lock := NewAgentLock(&modelStore{a: a, p: p}, id, LockOptions{Period: DefaultLockPeriod, Clock: a.clk,
		Log: zerolog.New(logWriter{w, a.name}).Level(zerolog.InfoLevel), alive: w.alive})
	for {
		err := lock.Acquire(ctx, a.takeOver)
		var held *HeldError
		if errors.As(err, &held) {
			w.mu.Lock()
			w.stats.refusals++
			if held.Again > 0 {
				w.stats.refusedTakeOvers++
			}
			w.logf("%s refused: %v", a.name, err)
			w.mu.Unlock()
			return
		}
		if err == nil {
			break
		}
		w.mu.Lock()
		backoff := draw(a.rng, time.Second, 10*time.Second)
		w.mu.Unlock()
		if !sleep(ctx, backoff) {
			return
		}
	}
	w.mu.Lock()
	if left := lock.waitLeft(); left > 0 {
		w.stats.waits++
		if a.takeOver {
			w.stats.takeOvers++
		}
	}
	w.mu.Unlock()
	run, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := lock.Run(run); err != nil {
			w.mu.Lock()
			w.stats.lost++
			w.logf("%s stops: %v", a.name, err)
			w.mu.Unlock()
			stop()
		}
	})
	wg.Go(func() { a.deletes(run, p, lock) })
	if sleep(run, lifetime) {
		w.log("%s stops cleanly", a.name)
		stop()
	}
	wg.Wait()
	a.gate()
	if p.isKilled(w) {
		return
	}
	lock.Release()
	w.mu.Lock()
	w.stats.releases++
	w.mu.Unlock()
}

// deletes deletes as the executors do, until ctx ends.
func (a *modelAgent) deletes(ctx context.Context, p *proc, lock *AgentLock) {
	w := a.w
	for {
		w.mu.Lock()
		next, slow, settle := draw(a.rng, 200*time.Millisecond, 4*time.Second), a.rng.Float64() < w.p.slowBegin, draw(a.rng, 0, 20*time.Second)
		freeze, frozen := a.rng.Float64() < w.p.freezeC, draw(a.rng, 0, 40*time.Second)
		w.mu.Unlock()
		if !sleep(ctx, next) {
			return
		}
		a.gate()
		if lock.Held() != nil { // the delete transaction's Begin
			continue
		}
		if slow && !sleep(ctx, settle) { // its settle, the intent's fsync, the re-check
			return
		}
		a.gate()
		call, done, err := lock.Hold(ctx) // right before the call
		if err != nil {
			continue
		}
		check := time.Now()
		if freeze {
			w.mu.Lock()
			w.stats.frozenAfterCheck++
			w.mu.Unlock()
			a.freeze(frozen, " between its last check and its delete call")
		}
		a.gate()
		w.deleteCall(call, a, p, check)
		done()
	}
}

// proc is one run of an agent's process.
type proc struct {
	pid    int
	killed bool          // under w.mu
	dead   chan struct{} // closed when it is killed
}

func (p *proc) isKilled(w *world) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.killed
}

// fate is what containerd does with one call.
type fate struct {
	after time.Duration // from its send to its landing
	lost  bool          // the answer never comes
}

// send is the client's side of a call from a: none leaves a frozen
// process, gRPC refuses one whose deadline has passed, and containerd
// refuses every call while it restarts. Otherwise it draws its fate.
func (w *world) send(ctx context.Context, a *modelAgent, p *proc, rng *rand.Rand, maxSlow time.Duration) (fate, error) {
	a.gate()
	if p.isKilled(w) {
		return fate{}, errors.New("killed")
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= 0 || ctx.Err() != nil {
		return fate{}, fmt.Errorf("rpc error: code = DeadlineExceeded desc = %w", context.DeadlineExceeded)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Now().Before(w.downUntil) {
		return fate{}, fmt.Errorf("connection refused: %w", errdefs.ErrUnavailable)
	}
	f := fate{after: draw(rng, time.Millisecond, 30*time.Millisecond), lost: rng.Float64() < w.p.lost}
	if rng.Float64() < w.p.slow {
		f.after = draw(rng, time.Millisecond, maxSlow)
	}
	return f, nil
}

// land applies a call with fate f (apply runs under w.mu, unless
// containerd is down by then: the call is lost with it) and answers the
// caller, unless the answer is lost or ctx ended first. A call of a
// process killed before its landing lands when it dies if diesWith (the
// model's bound: a delete containerd applies after the process that sent
// it died is not covered), else when its fate says.
func (w *world) land(ctx context.Context, f fate, p *proc, diesWith bool, apply func() error) error {
	answer := make(chan error, 1)
	dl, hasDL := ctx.Deadline()
	w.inflight.Go(func() {
		t := time.NewTimer(f.after)
		defer t.Stop()
		dead := p.dead
		if !diesWith {
			dead = nil
		}
		select {
		case <-t.C:
		case <-dead:
		}
		w.mu.Lock()
		if time.Now().Before(w.downUntil) {
			w.mu.Unlock()
			answer <- fmt.Errorf("connection reset: %w", errdefs.ErrUnavailable)
			return
		}
		if f.lost {
			w.stats.lostAnswers++
		}
		if hasDL && time.Now().After(dl) {
			w.stats.slowLands++
		}
		err := apply()
		w.mu.Unlock()
		if !f.lost {
			answer <- err
		}
	})
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
		return fmt.Errorf("rpc error: code = DeadlineExceeded desc = %w", ctx.Err())
	}
}

// deleteCall is one delete of a, allowed by the check at check.
func (w *world) deleteCall(ctx context.Context, a *modelAgent, p *proc, check time.Time) {
	f, err := w.send(ctx, a, p, a.deleteFates, 9*time.Second)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			w.mu.Lock()
			w.stats.refused++
			w.logf("%s delete (checked at %.3fs) refused before it left: %v", a.name, check.Sub(w.t0).Seconds(), err)
			w.mu.Unlock()
		}
		return
	}
	dl, hasDL := ctx.Deadline()
	_ = w.land(ctx, f, p, true, func() error {
		now := time.Now()
		n := w.logf("%s delete (checked at %.3fs) applied%s", a.name, check.Sub(w.t0).Seconds(), f.note())
		if hasDL && now.After(dl) {
			w.stats.cutOffLands++
		}
		w.stats.deletes++
		w.windows = append(w.windows, window{agent: a.name, check: check, applied: now, n: n})
		return nil
	})
}

// overlap describes the first two windows of different agents that
// overlap, or is "".
func (w *world) overlap() string {
	ws := slices.Clone(w.windows)
	slices.SortFunc(ws, func(x, y window) int { return x.check.Compare(y.check) })
	for i, x := range ws {
		for _, y := range ws[i+1:] {
			if !y.check.Before(x.applied) {
				break
			}
			if y.agent != x.agent {
				return fmt.Sprintf("delete windows overlap: %s's from %.3fs to %.3fs (trace line %d) and %s's from %.3fs to %.3fs (trace line %d)",
					x.agent, x.check.Sub(w.t0).Seconds(), x.applied.Sub(w.t0).Seconds(), x.n,
					y.agent, y.check.Sub(w.t0).Seconds(), y.applied.Sub(w.t0).Seconds(), y.n)
			}
		}
	}
	return ""
}

// traceUpTo is the trace up to the later landing of overlap o, without
// the deletes that are not part of it (the lock's calls and faults stay).
func (w *world) traceUpTo(o string) string {
	var a, b int
	if i := strings.Index(o, "(trace line "); i >= 0 {
		fmt.Sscanf(o[i:], "(trace line %d)", &a)
		if j := strings.LastIndex(o, "(trace line "); j > i {
			fmt.Sscanf(o[j:], "(trace line %d)", &b)
		}
	}
	last := min(max(a, b), len(w.trace)-1)
	var out []string
	for i, l := range w.trace[:last+1] {
		if i != a && i != b && strings.Contains(l, " delete (checked at ") && !strings.Contains(l, "refused") {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// modelStore is the lease store as agent a reaches it.
type modelStore struct {
	a *modelAgent
	p *proc
}

var (
	_ leaseStore = (*modelStore)(nil)
	_ labelStore = (*modelStore)(nil)
)

func (s *modelStore) Labels(ctx context.Context, _ string) (map[string]string, error) {
	w := s.a.w
	f, err := w.send(ctx, s.a, s.p, s.a.lockFates, 40*time.Second)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if err := w.land(ctx, f, s.p, false, func() error { maps.Copy(out, w.nsLabels); return nil }); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *modelStore) SetLabel(ctx context.Context, _ string, key, value string) error {
	w := s.a.w
	f, err := w.send(ctx, s.a, s.p, s.a.lockFates, 40*time.Second)
	if err != nil {
		return err
	}
	return w.land(ctx, f, s.p, false, func() error {
		if value == "" {
			delete(w.nsLabels, key)
		} else {
			w.nsLabels[key] = value
		}
		w.logf("%s label %s=%q%s", s.a.name, key, value, f.note())
		return nil
	})
}

func (s *modelStore) Create(ctx context.Context, opts ...leases.Opt) (leases.Lease, error) {
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return leases.Lease{}, err
		}
	}
	w := s.a.w
	f, err := w.send(ctx, s.a, s.p, s.a.lockFates, 40*time.Second)
	if err != nil {
		return leases.Lease{}, err
	}
	err = w.land(ctx, f, s.p, false, func() error {
		if _, ok := w.leases[l.ID]; ok {
			w.logf("%s create %s: already exists%s", s.a.name, l.ID, f.note())
			return fmt.Errorf("lease %q: %w", l.ID, errdefs.ErrAlreadyExists)
		}
		w.leases[l.ID] = l
		w.logf("%s create %s: made%s", s.a.name, l.ID, f.note())
		return nil
	})
	return l, err
}

func (s *modelStore) Delete(ctx context.Context, l leases.Lease, _ ...leases.DeleteOpt) error {
	w := s.a.w
	f, err := w.send(ctx, s.a, s.p, s.a.lockFates, 40*time.Second)
	if err != nil {
		return err
	}
	return w.land(ctx, f, s.p, false, func() error {
		if _, ok := w.leases[l.ID]; !ok {
			return errdefs.ErrNotFound
		}
		delete(w.leases, l.ID)
		w.logf("%s delete lease %s%s", s.a.name, l.ID, f.note())
		return nil
	})
}

func (s *modelStore) List(ctx context.Context, _ ...string) ([]leases.Lease, error) {
	w := s.a.w
	f, err := w.send(ctx, s.a, s.p, s.a.lockFates, 40*time.Second)
	if err != nil {
		return nil, err
	}
	var out []leases.Lease
	err = w.land(ctx, f, s.p, false, func() error {
		for _, l := range w.leases {
			out = append(out, l)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (f fate) note() string {
	var s string
	if f.after > time.Second {
		s += fmt.Sprintf(" (slow: %s after it was sent)", f.after.Round(time.Millisecond))
	}
	if f.lost {
		s += " (answer lost)"
	}
	return s
}
