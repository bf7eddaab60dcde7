package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/projection"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	_ containerRuntime = (*fakeContainerRuntime)(nil)
	_ Publisher        = (*fakePublisher)(nil)
)

// fakeContainerRuntime is a hand-written runtime: each id has a liveness
// (LiveDead unless set), deletes turn it LiveGone, and errors can be
// injected per operation and id.
type fakeContainerRuntime struct {
	mu      sync.Mutex
	live    map[string]Liveness
	errs    map[string]error // "op id" -> error, returned once
	calls   []string         // "op id", in order
	deleted chan string      // every successful delete, if non-nil
	// violations are deletes asked for objects the runtime calls alive.
	violations []string
	// afterCall, if set, runs (under the lock) after each call, also a
	// failing one.
	afterCall func(op, id string)
}

func newFakeContainerRuntime() *fakeContainerRuntime {
	return &fakeContainerRuntime{live: map[string]Liveness{}, errs: map[string]error{}, deleted: make(chan string, 100)}
}

// Set says what the runtime reports for id.
func (f *fakeContainerRuntime) Set(id string, l Liveness) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[id] = l
}

// InjectError makes the next call op (e.g. "delete-native") on id fail.
func (f *fakeContainerRuntime) InjectError(op, id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[op+" "+id] = err
}

// Calls returns the calls so far.
func (f *fakeContainerRuntime) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Deletes returns the successful deletes of containers so far, as "op
// id" (reads and logs left out).
func (f *fakeContainerRuntime) Deletes() []string {
	var out []string
	for _, c := range f.Calls() {
		if !strings.Contains(c, "liveness") && !strings.Contains(c, "-log") && !strings.HasSuffix(c, "!") {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeContainerRuntime) call(op, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.afterCall != nil {
		defer f.afterCall(op, id)
	}
	if err, ok := f.errs[op+" "+id]; ok {
		delete(f.errs, op+" "+id)
		f.calls = append(f.calls, op+" "+id+" !")
		return err
	}
	f.calls = append(f.calls, op+" "+id)
	return nil
}

func (f *fakeContainerRuntime) liveness(op, id string) (Liveness, error) {
	if err := f.call(op, id); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.live[id]; ok {
		return l, nil
	}
	return LiveDead, nil
}

func (f *fakeContainerRuntime) remove(op, id string) error {
	if err := f.call(op, id); err != nil {
		return err
	}
	f.mu.Lock()
	l, ok := f.live[id]
	// CRI removes a created container as it is (nothing runs to stop).
	if ok && l != LiveDead && l != LiveGone && (op != "cri-remove" || l != LiveCreated) {
		// The executor must never ask this: record it, fail the delete.
		f.violations = append(f.violations, fmt.Sprintf("%s on %s which is %s", op, id, l))
		f.mu.Unlock()
		return fmt.Errorf("%s is %s", id, l)
	}
	f.live[id] = LiveGone
	f.mu.Unlock()
	if f.deleted != nil {
		f.deleted <- id
	}
	return nil
}

func (f *fakeContainerRuntime) NativeLiveness(_ context.Context, _, id string) (Liveness, error) {
	return f.liveness("native-liveness", id)
}
func (f *fakeContainerRuntime) DeleteNative(_ context.Context, _, id string) (OwnerCleanup, error) {
	return OwnerCleanup{}, f.remove("delete-native", id)
}
func (f *fakeContainerRuntime) CRIContainerLiveness(_ context.Context, id string) (Liveness, error) {
	return f.liveness("cri-liveness", id)
}
func (f *fakeContainerRuntime) CRIContainerLogPath(_ context.Context, id string) (string, error) {
	if err := f.call("cri-log-path", id); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live[id] == LiveGone {
		return "", ErrContainerGone
	}
	return "/var/log/pods/default_pod_uid/" + id + "/0.log", nil
}
func (f *fakeContainerRuntime) RemoveCRIContainer(_ context.Context, id string) error {
	return f.remove("cri-remove", id)
}
func (f *fakeContainerRuntime) CRISandboxLiveness(_ context.Context, id string) (Liveness, error) {
	return f.liveness("sandbox-liveness", id)
}
func (f *fakeContainerRuntime) RemoveCRISandbox(_ context.Context, id string) error {
	return f.remove("sandbox-remove", id)
}

// ContainerCreated is not a call the tests count: a fixed creation time,
// or ErrOwnerWon for a container already gone.
func (f *fakeContainerRuntime) ContainerCreated(_ context.Context, _, id string) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live[id] == LiveGone {
		return time.Time{}, ErrOwnerWon
	}
	return fakeCreated, nil
}

// fakeCreated is every fake container's creation time.
var fakeCreated = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

// fakePublisher records actions, and signals each on published if set.
type fakePublisher struct {
	mu        sync.Mutex
	actions   []Action
	err       error
	published chan Action
}

func (p *fakePublisher) Publish(a Action) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = append(p.actions, a)
	if p.published != nil {
		p.published <- a
	}
	return p.err
}

func (p *fakePublisher) Actions() []Action {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.actions)
}

// nodeState is a node with a native container (dead), a running one, a
// never-started one, and a pod with three runs of "app" (all dead), a
// running "side", and a second, emptied pod with an exited sandbox.
func nodeState() *projection.State {
	s := build(flat(
		dead(0, time.Second, "n-dead", "img"),
		native(0, "n-run", "img"), start(0, "n-run"),
		native(0, "n-created", "img"),
		sandbox(0, "sb1", "u1"), start(0, "sb1"),
		criDead(10*time.Second, time.Second, "app-1", "img", "u1", "app", "sb1"),
		criDead(20*time.Second, time.Second, "app-2", "img", "u1", "app", "sb1"),
		criDead(30*time.Second, time.Second, "app-3", "img", "u1", "app", "sb1"),
		criContainer(5*time.Second, "side", "img", "u1", "side", "sb1"), start(5*time.Second, "side"),
		sandbox(0, "sb2", "u2"), start(0, "sb2"),
		criDead(1*time.Second, time.Second, "gone-1", "img", "u2", "job", "sb2"),
		exit(3*time.Second, "sb2"),
		events.Synced{At: at(40 * time.Second)},
	)...)
	return s
}

// allPolicy keeps one dead container per unit and two in all: n-dead, a
// plain container, goes by its TTL, app-1 and app-2 by the per-unit cap
// (the kubelet's status, lagging 10 s here, has moved on from app-2).
var allPolicy = ContainerPolicy{MinAge: 0, MaxPerEvictUnit: 1, MaxContainers: 2, Prune: PruneAll, KubeletStatusLag: 10 * time.Second}

func TestContainerExecutorApply(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	var ids []string
	for _, it := range plan.Remove {
		ids = append(ids, it.ID)
	}
	// gone-1 is within both caps: its pod is not empty, so sb2 stays too.
	if want := []string{"n-dead", "app-1", "app-2"}; !slices.Equal(ids, want) {
		t.Fatalf("plan removes %v, want %v", ids, want)
	}

	tests := []struct {
		name        string
		setup       func(f *fakeContainerRuntime)
		wantDeletes []string
		wantOut     map[string]ContainerOutcome
		wantErr     string
	}{{
		name:        "each kind through its own API",
		wantDeletes: []string{"delete-native n-dead", "cri-remove app-1", "cri-remove app-2"},
		wantOut:     map[string]ContainerOutcome{"app-1": ContainerRemoved, "app-2": ContainerRemoved, "n-dead": ContainerRemoved},
	}, {
		name: "a container that runs again is kept",
		setup: func(f *fakeContainerRuntime) {
			f.Set("n-dead", LiveRunning)
			f.Set("app-2", LiveCreated)
		},
		wantDeletes: []string{"cri-remove app-1"},
		wantOut:     map[string]ContainerOutcome{"app-1": ContainerRemoved, "app-2": ContainerKept, "n-dead": ContainerKept},
	}, {
		name:        "gone already is success without a delete",
		setup:       func(f *fakeContainerRuntime) { f.Set("app-1", LiveGone) },
		wantDeletes: []string{"delete-native n-dead", "cri-remove app-2"},
		wantOut:     map[string]ContainerOutcome{"app-1": ContainerGone, "app-2": ContainerRemoved, "n-dead": ContainerRemoved},
	}, {
		name: "per-item errors are joined and the loop goes on",
		setup: func(f *fakeContainerRuntime) {
			f.InjectError("cri-remove", "app-1", errors.New("boom"))
			f.InjectError("native-liveness", "n-dead", errors.New("containerd down"))
		},
		wantDeletes: []string{"cri-remove app-2"},
		wantOut:     map[string]ContainerOutcome{"app-1": ContainerFailed, "app-2": ContainerRemoved, "n-dead": ContainerFailed},
		wantErr:     "re-check native n-dead: containerd down\nremove container app-1: boom",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeContainerRuntime()
			if tc.setup != nil {
				tc.setup(f)
			}
			pub := &fakePublisher{}
			reg := prometheus.NewRegistry()
			m, err := NewContainerMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			// One worker: the order of deletes and errors is the plan's.
			e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, pub, f), Publisher: pub}, ContainerExecutorOptions{Metrics: m, Parallelism: 1, Clock: clock.System(func() time.Time { return at(time.Minute) })})
			res, err := e.Apply(context.Background(), plan, allPolicy)
			if got := errString(err); got != tc.wantErr {
				t.Errorf("error %q, want %q", got, tc.wantErr)
			}
			if got := f.Deletes(); !slices.Equal(got, tc.wantDeletes) {
				t.Errorf("deletes %v, want %v", got, tc.wantDeletes)
			}
			got := map[string]ContainerOutcome{}
			for _, r := range res {
				got[r.ID] = r.Outcome
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantOut) {
				t.Errorf("outcomes %v, want %v", got, tc.wantOut)
			}
			removed := 0
			for _, o := range tc.wantOut {
				if o == ContainerRemoved {
					removed++
				}
			}
			if n := len(pub.Actions()); n != removed {
				t.Errorf("%d actions published, want %d", n, removed)
			}
			if n := testutil.CollectAndCount(m.latency); removed > 0 && n == 0 {
				t.Errorf("no latency observed")
			}
			var sum float64
			for _, k := range []string{"native", "container"} {
				for _, r := range []Reason{ReasonPerUnitCap, ReasonGlobalCap, ReasonTTLExpired} {
					sum += testutil.ToFloat64(m.removed.WithLabelValues("", k, string(r)))
				}
			}
			if int(sum) != removed {
				t.Errorf("removed metric %v, want %d", sum, removed)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestContainerExecutorNeverTouchesTheLiving: whatever a (wrong) plan says,
// the re-check keeps running containers, never-started ones and sandboxes
// of live pods; the fake panics if a delete reaches one.
func TestContainerExecutorNeverTouchesTheLiving(t *testing.T) {
	f := newFakeContainerRuntime()
	f.Set("run", LiveRunning)
	f.Set("new", LiveCreated)
	f.Set("sb-ready", LiveRunning)
	f.Set("sb-full", LiveHasContainers)
	f.Set("odd", LiveUnknown)
	plan := ContainerPlan{Remove: []ContainerItem{
		{ID: "run", Reason: ReasonGlobalCap},
		{ID: "new", CRIKind: projection.KindContainer, Reason: ReasonPerUnitCap},
		{ID: "odd", CRIKind: projection.KindContainer, Reason: ReasonPerUnitCap},
		{ID: "sb-ready", CRIKind: projection.KindSandbox, Reason: ReasonSandboxOrphaned},
		{ID: "sb-full", CRIKind: projection.KindSandbox, Reason: ReasonSandboxOrphaned},
		{ID: "weird", CRIKind: "something-new", Reason: ReasonGlobalCap},
	}}
	pub := &fakePublisher{}
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, pub, f), Publisher: pub}, ContainerExecutorOptions{})
	res, err := e.Apply(context.Background(), plan, allPolicy)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Outcome != ContainerKept {
			t.Errorf("%s: %s, want kept", r.ID, r.Outcome)
		}
	}
	if d := f.Deletes(); len(d) != 0 || len(pub.Actions()) != 0 || len(f.violations) != 0 {
		t.Errorf("deletes %v, actions %v, violations %v", d, pub.Actions(), f.violations)
	}
}

func TestContainerExecutorPublishesDeterministicKeys(t *testing.T) {
	exited := at(3 * time.Second)
	plan := ContainerPlan{Remove: []ContainerItem{{ID: "c1", EvictUnit: "c1", ExitedAt: exited, State: projection.StateExited, Reason: ReasonGlobalCap}}}
	pub := &fakePublisher{}
	f := newFakeContainerRuntime()
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, pub, f), Publisher: pub}, ContainerExecutorOptions{Clock: clock.System(func() time.Time { return at(5 * time.Second) })})
	if _, err := e.Apply(context.Background(), plan, ContainerPolicy{MinAge: time.Second, MaxContainers: 0, MaxPerEvictUnit: -1, Prune: PruneNative}); err != nil {
		t.Fatal(err)
	}
	acts := pub.Actions()
	if len(acts) != 1 {
		t.Fatalf("actions %v", acts)
	}
	a := acts[0]
	if a.Kind != "container" || a.Action != "removed" || a.Subject != "c1" || a.Key != fmt.Sprintf("c1@%d", exited.UnixNano()) {
		t.Errorf("action %+v", a)
	}
	d := a.Data.(ContainerRemoval)
	if d.Kind != "native" || d.Reason != ReasonGlobalCap || d.Rule != "maximum-dead-containers=0" ||
		!d.EligibleAt.Equal(at(4*time.Second)) || d.LatencySecs != 1 || d.DryRun {
		t.Errorf("data %+v", d)
	}
}

func TestContainerExecutorDryRun(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	pub := &fakePublisher{}
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Publisher: pub}, ContainerExecutorOptions{DryRun: true})
	for range 2 {
		res, err := e.Apply(context.Background(), plan, allPolicy)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != ContainerWouldRemove {
				t.Errorf("%s: %s", r.ID, r.Outcome)
			}
		}
	}
	if d := f.Deletes(); len(d) != 0 {
		t.Errorf("dry run deleted %v", d)
	}
	acts := pub.Actions()
	if len(acts) != len(plan.Remove) {
		t.Fatalf("%d actions over two dry passes, want %d (once each)", len(acts), len(plan.Remove))
	}
	for _, a := range acts {
		// A dry run is container.skipped with reason dry-run (issue 25,
		// finding 8), never on the removal subject.
		d, ok := a.Data.(ContainerSkip)
		if !ok || a.Action != ActionSkipped || !d.DryRun || d.SkipReason != "dry-run" || !strings.HasSuffix(a.Key, "#dry-run") {
			t.Errorf("dry-run action %+v", a)
		}
	}
}

func TestContainerExecutorEligibility(t *testing.T) {
	// Three runs of one unit exit at 1s, 2s, 3s; MinAge 10s; cap 1. The
	// oldest is pushed out when the middle one passes MinAge (12s), the
	// middle one when the newest does (13s).
	s := build(flat(
		sandbox(0, "sb", "u"), start(0, "sb"),
		criDead(0, 1*time.Second, "r1", "img", "u", "app", "sb"),
		criDead(time.Second, 1*time.Second, "r2", "img", "u", "app", "sb"),
		criDead(2*time.Second, 1*time.Second, "r3", "img", "u", "app", "sb"),
		events.Synced{At: at(3 * time.Second)},
	)...)
	p := ContainerPolicy{MinAge: 10 * time.Second, MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll, KubeletStatusLag: time.Second}
	plan := PlanContainers(s, p, at(20*time.Second))
	f := newFakeContainerRuntime()
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, nil, f)}, ContainerExecutorOptions{Clock: clock.System(func() time.Time { return at(20 * time.Second) })})
	res, err := e.Apply(context.Background(), plan, p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{"r1": at(12 * time.Second), "r2": at(13 * time.Second)}
	if len(res) != len(want) {
		t.Fatalf("results %+v", res)
	}
	for _, r := range res {
		if !r.EligibleAt.Equal(want[r.ID]) {
			t.Errorf("%s eligible at %s, want %s", r.ID, r.EligibleAt.Sub(t0), want[r.ID].Sub(t0))
		}
	}
}

// TestContainerExecutorSandboxAfterItsContainers: with no dead container
// kept, an emptied pod's exited sandbox goes through CRI after its
// containers, and a pod with a running container keeps its sandbox.
func TestContainerExecutorSandboxAfterItsContainers(t *testing.T) {
	p := ContainerPolicy{MaxPerEvictUnit: 0, MaxContainers: -1, Prune: PruneAll, KubeletStatusLag: time.Second}
	s := nodeState()
	// u2's log dir is gone and its sandbox stopped: it is deleted, and its
	// sandbox goes in the same pass as its container, after it.
	plan := PlanContainersWith(s, p, at(time.Minute), PodLogDirView{In: KnownInput(at(time.Minute)), GoneFn: func(uid, _, _ string) (time.Time, bool) {
		return at(0), uid == "u2"
	}})
	f := newFakeContainerRuntime()
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, nil, f)}, ContainerExecutorOptions{})
	if _, err := e.Apply(context.Background(), plan, p); err != nil {
		t.Fatal(err)
	}
	// Containers go on parallel workers, in any order, then the sandboxes.
	want := []string{"cri-remove app-1", "cri-remove app-2", "cri-remove app-3", "cri-remove gone-1", "delete-native n-dead", "sandbox-remove sb2"}
	got := f.Deletes()
	if sorted := slices.Sorted(slices.Values(got)); !slices.Equal(sorted, want) {
		t.Fatalf("deletes %v, want %v", sorted, want)
	}
	if got[len(got)-1] != "sandbox-remove sb2" {
		t.Fatalf("deletes %v: want the sandbox after its containers", got)
	}
	if !slices.Contains(f.Calls(), "sandbox-liveness sb2") {
		t.Errorf("sandbox removed without a CRI re-check: %v", f.Calls())
	}
}

// TestContainerExecutorOwnerWon: when the owner deletes the container
// between the re-check and our delete, that is counted, not an error, and
// not retried; a lease holding its snapshot keeps it.
func TestContainerExecutorOwnerWon(t *testing.T) {
	p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneNative}
	plan := PlanContainers(nodeState(), p, at(time.Minute))
	m, err := NewContainerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeContainerRuntime()
	f.InjectError("delete-native", "n-dead", fmt.Errorf("delete container: %w", ErrOwnerWon))
	res, err := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, nil, f)}, ContainerExecutorOptions{Metrics: m}).Apply(context.Background(), plan, p)
	if err != nil {
		t.Fatalf("owner won is not an error: %v", err)
	}
	if len(res) != 1 || res[0].Outcome != ContainerGone {
		t.Fatalf("results %+v, want n-dead gone", res)
	}
	if n := testutil.ToFloat64(m.won.WithLabelValues(ContainerKindNative)); n != 1 {
		t.Errorf("owner-won metric %v, want 1", n)
	}

	f = newFakeContainerRuntime()
	f.Set("n-dead", LiveLeased)
	res, _ = mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, nil, f)}, ContainerExecutorOptions{}).Apply(context.Background(), plan, p)
	if len(res) != 1 || res[0].Outcome != ContainerKept || res[0].Live != LiveLeased || len(f.Deletes()) != 0 {
		t.Errorf("leased: results %+v, deletes %v", res, f.Deletes())
	}
}

// TestContainerExecutorNeverStarted: a CRI container planned as never
// started (past NeverStartedGrace) is removed while CRI still calls it
// created (nobody started it); a dead container CRI calls created is kept.
func TestContainerExecutorNeverStarted(t *testing.T) {
	p := ContainerPolicy{MaxPerEvictUnit: 0, MaxContainers: -1, Prune: PruneAll, KubeletStatusLag: time.Second}
	s := build(flat(
		sandbox(0, "sb", "u"), start(0, "sb"),
		criContainer(0, "stuck", "img", "u", "app", "sb"),
		criDead(0, time.Second, "dead", "img", "u", "job", "sb"),
	)...)
	plan := PlanContainers(s, p, at(2*time.Minute))
	if got := containerSummary(plan.Remove); !slices.Equal(got, []string{"stuck per-unit-cap", "dead per-unit-cap"}) {
		t.Fatalf("plan removes %q", got)
	}
	f := newFakeContainerRuntime()
	f.Set("stuck", LiveCreated)
	f.Set("dead", LiveCreated)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, nil, f)}, ContainerExecutorOptions{})
	res, err := e.Apply(context.Background(), plan, p)
	if err != nil {
		t.Fatal(err)
	}
	outcome := map[string]ContainerOutcome{}
	for _, r := range res {
		outcome[r.ID] = r.Outcome
	}
	if outcome["stuck"] != ContainerRemoved || outcome["dead"] != ContainerKept {
		t.Errorf("outcomes %v: want stuck removed, dead kept", outcome)
	}
}
