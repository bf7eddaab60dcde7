package gc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

const mib = 1 << 20

// fakeRuntime is containerd as the image executor sees it: names by
// digest, containers by image name, and a disk that grows by the bytes each
// image frees when it is removed.
type fakeRuntime struct {
	mu      sync.Mutex
	names   map[string][]ImageName // by digest
	users   map[string][]string    // container ids by image name, "config:<id>" or "chain:<id>"
	frees   map[string]uint64      // bytes a digest's removal frees
	errs    map[string]error       // op+" "+digest -> injected error
	leased  map[string]bool        // content digests a lease holds
	disk    *fakeDisk
	calls   []string
	removed []string // digests, in order
	// beforeRemove runs right before a removal, to race the executor.
	beforeRemove func(digest string)
	// failAfterRemove makes a removal of a digest return its error after
	// it happened (containerd committed it; the reply was lost).
	failAfterRemove map[string]error
}

var (
	_ imageNode = (*fakeRuntime)(nil)
	_ diskMeter = (*fakeDisk)(nil)
)

func newFakeRuntime(d *fakeDisk) *fakeRuntime {
	return &fakeRuntime{names: map[string][]ImageName{}, users: map[string][]string{}, frees: map[string]uint64{},
		errs: map[string]error{}, leased: map[string]bool{}, disk: d}
}

// Add registers an image: its names (labels as name|k=v) and the bytes its
// removal frees.
func (f *fakeRuntime) Add(digest string, frees uint64, names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		name, kv, _ := strings.Cut(n, "|")
		labels := map[string]string{}
		if kv != "" {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
		f.names[digest] = append(f.names[digest], ImageName{Name: name, Labels: labels})
	}
	slices.SortFunc(f.names[digest], func(a, b ImageName) int { return strings.Compare(a.Name, b.Name) })
	f.frees[digest] = frees
}

// Use makes container id a user of image name.
func (f *fakeRuntime) Use(name, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[name] = append(f.users[name], id)
}

// Lease makes a lease hold digest (held) or lets it go.
func (f *fakeRuntime) Lease(digest string, held bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leased[digest] = held
}

// Calls returns how many calls of op ("names", "remove", "leases") were made.
func (f *fakeRuntime) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == op || strings.HasPrefix(c, op+" ") {
			n++
		}
	}
	return n
}

// InjectError makes op ("names", "users", "remove") on digest fail, or
// listing the leases when op is "leases" and digest empty.
func (f *fakeRuntime) InjectError(op, digest string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[op+" "+digest] = err
}

func (f *fakeRuntime) Removed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.removed)
}

func (f *fakeRuntime) ImageNames(_ context.Context, _, digest string) ([]ImageName, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "names "+digest)
	if err := f.errs["names "+digest]; err != nil {
		return nil, err
	}
	return slices.Clone(f.names[digest]), nil
}

func (f *fakeRuntime) ImageHolders(_ context.Context, _ string, img ImageRef) ([]Holder, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Holder
	for _, n := range append(slices.Clone(img.Names), "config:"+img.Config, "chain:"+img.Chain) {
		if err := f.errs["users "+n]; err != nil {
			return nil, err
		}
		for _, id := range f.users[n] {
			out = append(out, Holder{Kind: HolderContainer, ID: id})
		}
	}
	f.calls = append(f.calls, "leases")
	if err := f.errs["leases "]; err != nil {
		return nil, err
	}
	if f.leased[img.Digest] {
		out = append(out, Holder{Kind: HolderLease, ID: "lease-of-" + img.Digest})
	}
	slices.SortFunc(out, func(a, b Holder) int { return strings.Compare(a.Kind+a.ID, b.Kind+b.ID) })
	return out, nil
}

func (f *fakeRuntime) RemoveImage(_ context.Context, _, digest string, names []ImageName) (string, error) {
	if f.beforeRemove != nil {
		f.beforeRemove(digest)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "remove "+digest)
	if err := f.errs["remove "+digest]; err != nil {
		return "native", err
	}
	if len(names) != len(f.names[digest]) {
		return "native", fmt.Errorf("asked to remove %d names of %s, it has %d", len(names), digest, len(f.names[digest]))
	}
	delete(f.names, digest)
	f.removed = append(f.removed, digest)
	f.disk.Free(f.frees[digest])
	if err := f.failAfterRemove[digest]; err != nil {
		return "native", err
	}
	return "native", nil
}

// fakeDisk is a filesystem of fixed capacity.
type fakeDisk struct {
	mu        sync.Mutex
	capacity  uint64
	available uint64
	err       error
}

func (d *fakeDisk) Disk() (DiskStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return DiskStats{CapacityBytes: d.capacity, AvailableBytes: d.available}, d.err
}

func (d *fakeDisk) Free(n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.available = min(d.capacity, d.available+n)
}

func (d *fakeDisk) Fill(n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.available -= min(n, d.available)
}

// node is a scenario: a 100 MiB disk at 90% usage and five unused images
// a..e of 4 MiB each, used (and left) in the order a, b, c, d, e, plus a
// pinned one and one in use.
type node struct {
	disk  *fakeDisk
	rt    *fakeRuntime
	state *projection.State
}

func digestOf(n string) string { return "sha256:" + strings.Repeat(n, 4) }

func newNode() *node {
	d := &fakeDisk{capacity: 100 * mib, available: 10 * mib}
	n := &node{disk: d, rt: newFakeRuntime(d)}
	var evs []events.Event
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		img := "example.test/" + name + ":1"
		evs = append(evs, pull(0, img, digestOf(name), 4*mib))
		evs = append(evs, native(time.Duration(i+1)*m, "use-"+name, img), remove(time.Duration(i+1)*m+time.Second, "use-"+name))
		n.rt.Add(digestOf(name), 8*mib, img)
	}
	evs = append(evs, pull(0, "example.test/pinned:1", digestOf("p"), 4*mib, projection.LabelPinned+"="+projection.LabelPinnedValue))
	n.rt.Add(digestOf("p"), 8*mib, "example.test/pinned:1|"+projection.LabelPinned+"="+projection.LabelPinnedValue)
	evs = append(evs, pull(0, "example.test/run:1", digestOf("r"), 4*mib), native(0, "runner", "example.test/run:1"))
	n.rt.Add(digestOf("r"), 8*mib, "example.test/run:1")
	n.rt.Use("example.test/run:1", "runner")
	evs = append(evs, events.Synced{At: at(0)})
	n.state = build(evs...)
	return n
}

func (n *node) plan(p ImagePolicy, now time.Time) ImagePlan {
	d, _ := n.disk.Disk()
	return PlanImages([]*projection.State{n.state}, d, p, now)
}

func (n *node) executor(p ImagePolicy) *imageExecutor {
	deletes, err := deletion.New(deletion.Deps{Journal: &memJournal{}, Checker: n.rt}, deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		panic(err)
	}
	return &imageExecutor{deletes: deletes,
		rt: n.rt, disk: n.disk, policy: p, now: func() time.Time { return at(time.Hour) },
		synced: func() bool { return n.state.Synced },
		users:  func(_, d string) []string { return n.state.DigestUsers(d) },
	}
}

// executorPublishing is executor with delete transactions whose commits are
// published to pub.
func (n *node) executorPublishing(t testing.TB, p ImagePolicy, pub Publisher) *imageExecutor {
	x := n.executor(p)
	x.deletes = testDeletes1(t, pub, n.rt)
	return x
}

var policy8070 = ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * m}

func digests(os []ImageOutcome, action string) []string {
	var out []string
	for _, o := range os {
		if o.Action == action {
			out = append(out, o.Digest)
		}
	}
	return out
}

func reasons(os []ImageOutcome) map[string]Reason {
	out := map[string]Reason{}
	for _, o := range os {
		if o.Action == ActionSkipped {
			out[o.Digest] = o.Reason
		}
	}
	return out
}

func TestImageExecutorStopsAtLowThresholdMeasured(t *testing.T) {
	tests := []struct {
		name  string
		frees map[string]uint64 // per image, overriding 8 MiB
		want  []string
		skip  map[string]Reason
	}{
		// 90% used, low 80%: 10 MiB to free. Estimate (4 MiB each) plans a, b, c.
		{"measured frees more than estimated: stops after two", nil,
			[]string{"a", "b"}, map[string]Reason{"c": ReasonLowReached}},
		// a and b share their layers with others: removing them frees
		// nothing; the executor goes past the estimate to d.
		{"shared layers: goes past the estimate", map[string]uint64{"a": 0, "b": 0, "c": 4 * mib, "d": 4 * mib, "e": 4 * mib},
			[]string{"a", "b", "c", "d", "e"}, map[string]Reason{}},
		{"exact: stops when available reaches the low threshold", map[string]uint64{"a": 10 * mib},
			[]string{"a"}, map[string]Reason{"b": ReasonLowReached, "c": ReasonLowReached}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode()
			for k, v := range tt.frees {
				n.rt.frees[digestOf(k)] = v
			}
			plan := n.plan(policy8070, at(time.Hour))
			if got := len(plan.Delete); got != 3 {
				t.Fatalf("plan deletes %d images, want 3 (a, b, c)", got)
			}
			res := n.executor(policy8070).execute(context.Background(), plan)
			var want []string
			for _, w := range tt.want {
				want = append(want, digestOf(w))
			}
			if got := n.rt.Removed(); !slices.Equal(got, want) {
				t.Fatalf("removed %v, want %v", got, want)
			}
			skip := map[string]Reason{}
			for k, v := range tt.skip {
				skip[digestOf(k)] = v
			}
			if got := reasons(res.Outcomes); !maps.Equal(got, skip) {
				t.Errorf("skipped %v, want %v", got, skip)
			}
			if res.Err != nil {
				t.Errorf("err = %v", res.Err)
			}
			var freed int64
			for _, o := range res.Outcomes {
				freed += o.Freed
			}
			if res.FreedBytes != freed || res.EstimatedBytes != int64(len(want))*4*mib {
				t.Errorf("freed %d (sum %d), estimated %d", res.FreedBytes, freed, res.EstimatedBytes)
			}
		})
	}
}

// TestImageExecutorKeepsWhatTheFleetListNamesSinceThePlan: a pattern added
// to the fleet keep list while a pass runs keeps the image it names.
func TestImageExecutorKeepsWhatTheFleetListNamesSinceThePlan(t *testing.T) {
	a, b := digestOf("a"), digestOf("b")
	n := newNode()
	plan := n.plan(policy8070, at(time.Hour))
	x := n.executor(policy8070)
	x.fleetKeep = func() KeepList {
		return KeepList{Input: KnownInput(at(time.Hour)), Patterns: []string{"example.test/a:*"}}
	}
	res := x.execute(context.Background(), plan)
	if slices.Contains(n.rt.Removed(), a) || !slices.Contains(n.rt.Removed(), b) {
		t.Fatalf("removed %v: want b, not a", n.rt.Removed())
	}
	if got := reasons(res.Outcomes)[a]; got != ReasonKeepPattern {
		t.Errorf("skip reason %q, want %q", got, ReasonKeepPattern)
	}
}

func TestImageExecutorNeverDeletesWhatIsNoLongerACandidate(t *testing.T) {
	a, b := digestOf("a"), digestOf("b")
	tests := []struct {
		name   string
		race   func(n *node)
		reason Reason
	}{
		{"container created on it since the plan (containerd)", func(n *node) { n.rt.Use("example.test/a:1", "late") }, ReasonInUse},
		{"container created on it since the plan (projection)", func(n *node) {
			n.state.Apply(native(time.Hour, "late", "example.test/a:1"))
		}, ReasonInUse},
		{"new name since the plan", func(n *node) { n.rt.Add(a, 8*mib, "example.test/a:retag") }, ReasonChanged},
		{"pinned since the plan", func(n *node) {
			n.rt.names[a][0].Labels = map[string]string{projection.LabelPinned: projection.LabelPinnedValue}
		}, ReasonPinned},
		{"deleted by someone else", func(n *node) { delete(n.rt.names, a) }, ReasonGone},
		{"a pull of its target is in flight (lease)", func(n *node) { n.rt.Lease(a, true) }, ReasonInFlightPull},
		{"name moved to another target during the delete", func(n *node) {
			n.rt.InjectError("remove", a, fmt.Errorf("image %q: %w", "example.test/a:1", ErrImageChanged))
		}, ReasonChanged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode()
			plan := n.plan(policy8070, at(time.Hour))
			tt.race(n)
			res := n.executor(policy8070).execute(context.Background(), plan)
			if slices.Contains(n.rt.Removed(), a) {
				t.Fatalf("removed %s: %v", a, n.rt.Removed())
			}
			if got := reasons(res.Outcomes)[a]; got != tt.reason {
				t.Errorf("skip reason %q, want %q (%+v)", got, tt.reason, res.Outcomes)
			}
			if !slices.Contains(n.rt.Removed(), b) {
				t.Errorf("b not removed after a was skipped: %v", n.rt.Removed())
			}
			if res.Err != nil {
				t.Errorf("a race is not an error: %v", res.Err)
			}
		})
	}
}

func TestImageExecutorLeases(t *testing.T) {
	// Leases are read when each delete is decided, not once per pass
	// (issue 25, Deliver 2): a pull that starts during a pass is seen.
	t.Run("read at each decision; held image skipped, the next one goes", func(t *testing.T) {
		n := newNode()
		n.rt.Lease(digestOf("a"), true)
		n.rt.Lease("sha256:some-layer", true)
		plan := n.plan(policy8070, at(time.Hour))
		res := n.executor(policy8070).execute(context.Background(), plan)
		if got := reasons(res.Outcomes)[digestOf("a")]; got != ReasonInFlightPull {
			t.Errorf("a: skip reason %q, want %q", got, ReasonInFlightPull)
		}
		if got, want := n.rt.Removed(), []string{digestOf("b"), digestOf("c")}; !slices.Equal(got, want) {
			t.Errorf("removed %v, want %v", got, want)
		}
		if got, want := n.rt.Calls("leases"), 3; got != want {
			t.Errorf("leases read %d times in one pass, want %d (once per image decided)", got, want)
		}
		if res.Err != nil {
			t.Errorf("a lease is not an error: %v", res.Err)
		}
	})
	t.Run("lease released: removed on the next pass", func(t *testing.T) {
		n := newNode()
		n.rt.Lease(digestOf("a"), true)
		x := n.executor(policy8070)
		x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
		n.rt.Lease(digestOf("a"), false)
		n.disk.Fill(20 * mib)
		x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
		if !slices.Contains(n.rt.Removed(), digestOf("a")) {
			t.Errorf("a not removed once its lease ended: %v", n.rt.Removed())
		}
		if got := n.rt.Calls("leases"); got < 2 {
			t.Errorf("leases read %d times in two passes, want at least once a pass", got)
		}
	})
	t.Run("leases unknown: nothing deleted", func(t *testing.T) {
		n := newNode()
		boom := errors.New("leases: unavailable")
		n.rt.InjectError("leases", "", boom)
		plan := n.plan(policy8070, at(time.Hour))
		res := n.executor(policy8070).execute(context.Background(), plan)
		if got := n.rt.Removed(); len(got) != 0 {
			t.Fatalf("removed %v without knowing the leases", got)
		}
		if !errors.Is(res.Err, boom) {
			t.Errorf("err = %v, want the lease error", res.Err)
		}
		for _, d := range []string{digestOf("a"), digestOf("b"), digestOf("c")} {
			if got := reasons(res.Outcomes)[d]; got != ReasonDeleteFailed {
				t.Errorf("%s: skip reason %q, want %q", d, got, ReasonDeleteFailed)
			}
		}
		if got := n.rt.Calls("leases"); got < 3 {
			t.Errorf("leases read %d times in one pass, want once per image decided (3 planned)", got)
		}
	})
	t.Run("a pull that starts during the pass is seen at its decision", func(t *testing.T) {
		n := newNode()
		n.rt.beforeRemove = func(d string) {
			if d == digestOf("a") {
				n.rt.Lease(digestOf("b"), true) // a pull of b starts while a is deleted
			}
		}
		res := n.executor(policy8070).execute(context.Background(), n.plan(policy8070, at(time.Hour)))
		if slices.Contains(n.rt.Removed(), digestOf("b")) {
			t.Errorf("b removed though a lease held it when its delete was decided: %v", n.rt.Removed())
		}
		if got := reasons(res.Outcomes)[digestOf("b")]; got != ReasonInFlightPull {
			t.Errorf("b: skip reason %q, want %q", got, ReasonInFlightPull)
		}
	})
}

func TestImageExecutorCollectsErrorsAndGoesOn(t *testing.T) {
	n := newNode()
	boom, flaky := errors.New("boom"), errors.New("unavailable")
	n.rt.InjectError("remove", digestOf("a"), boom)
	n.rt.InjectError("names", digestOf("b"), flaky)
	plan := n.plan(policy8070, at(time.Hour))
	res := n.executor(policy8070).execute(context.Background(), plan)
	if !errors.Is(res.Err, boom) || !errors.Is(res.Err, flaky) {
		t.Fatalf("err = %v, want both injected errors", res.Err)
	}
	if !strings.Contains(res.Err.Error(), digestOf("a")) {
		t.Errorf("error does not name the image: %v", res.Err)
	}
	// c, d are needed (beyond the estimate) once a and b failed.
	if got, want := n.rt.Removed(), []string{digestOf("c"), digestOf("d")}; !slices.Equal(got, want) {
		t.Errorf("removed %v, want %v", got, want)
	}
	if r := reasons(res.Outcomes); r[digestOf("a")] != ReasonDeleteFailed || r[digestOf("b")] != ReasonDeleteFailed {
		t.Errorf("skip reasons %v", r)
	}
}

func TestImageExecutorDeletesNothingUnsyncedOrDry(t *testing.T) {
	t.Run("not synced", func(t *testing.T) {
		n := newNode()
		plan := n.plan(policy8070, at(time.Hour))
		n.state.Synced = false
		res := n.executor(policy8070).execute(context.Background(), plan)
		if got := n.rt.Removed(); len(got) != 0 {
			t.Fatalf("removed %v before the projection synced", got)
		}
		for d, r := range reasons(res.Outcomes) {
			if r != ReasonNotSynced {
				t.Errorf("%s: reason %q", d, r)
			}
		}
		if len(res.Outcomes) != len(plan.Delete) {
			t.Errorf("%d outcomes for %d planned", len(res.Outcomes), len(plan.Delete))
		}
	})
	t.Run("dry run", func(t *testing.T) {
		n := newNode()
		plan := n.plan(policy8070, at(time.Hour))
		x := n.executor(policy8070)
		x.dryRun = true
		res := x.execute(context.Background(), plan)
		if got := n.rt.Removed(); len(got) != 0 {
			t.Fatalf("dry run removed %v", got)
		}
		if len(n.rt.calls) == 0 {
			t.Errorf("dry run did not re-check")
		}
		// The estimate decides: a, b, c would go, as planned.
		want := map[string]Reason{digestOf("a"): ReasonDryRun, digestOf("b"): ReasonDryRun, digestOf("c"): ReasonDryRun}
		if got := reasons(res.Outcomes); !maps.Equal(got, want) {
			t.Errorf("outcomes %v, want %v", got, want)
		}
	})
}

func TestImageExecutorWithoutMeasurementUsesTheEstimate(t *testing.T) {
	n := newNode()
	n.rt.frees[digestOf("a")], n.rt.frees[digestOf("b")] = 0, 0
	plan := n.plan(policy8070, at(time.Hour))
	n.disk.err = errors.New("statfs: gone")
	res := n.executor(policy8070).execute(context.Background(), plan)
	want := []string{digestOf("a"), digestOf("b"), digestOf("c")}
	if got := n.rt.Removed(); !slices.Equal(got, want) {
		t.Fatalf("removed %v, want the plan's %v", got, want)
	}
	if res.Measured {
		t.Errorf("result claims a measurement")
	}
}

func TestImageExecutorMaxAgeWhateverTheDisk(t *testing.T) {
	n := newNode()
	n.disk.available = 90 * mib // 10%: far below the high threshold
	p := policy8070
	p.MaxAge = 3*m + 30*time.Second // a, b, c idle since 1m1s, 2m1s, 3m1s
	plan := n.plan(p, at(6*m))
	if plan.Triggered {
		t.Fatal("threshold GC triggered at 10%")
	}
	res := n.executor(p).execute(context.Background(), plan)
	want := []string{digestOf("a"), digestOf("b")}
	if got := n.rt.Removed(); !slices.Equal(got, want) {
		t.Fatalf("removed %v, want %v", got, want)
	}
	for _, o := range res.Outcomes {
		if o.Rule != ReasonMaxAge || o.Reason != ReasonMaxAge {
			t.Errorf("%s: rule %q reason %q", o.Digest, o.Rule, o.Reason)
		}
	}
}

func TestImageExecutorProtectedNeverReached(t *testing.T) {
	n := newNode()
	n.disk.available = 0 // 100% used, and each image frees little: everything deletable must go
	for d := range n.rt.frees {
		n.rt.frees[d] = mib
	}
	var asked []string
	n.rt.beforeRemove = func(d string) { asked = append(asked, d) }
	plan := n.plan(policy8070, at(time.Hour))
	n.executor(policy8070).execute(context.Background(), plan)
	for _, d := range []string{digestOf("p"), digestOf("r")} {
		if slices.Contains(asked, d) {
			t.Errorf("asked to remove protected %s", d)
		}
	}
	if got := len(n.rt.Removed()); got != 5 {
		t.Errorf("removed %d images, want all 5 candidates", got)
	}
}

func TestLowReached(t *testing.T) {
	tests := []struct {
		capacity, available uint64
		low                 int
		want                bool
	}{
		{100, 20, 80, true},
		{100, 19, 80, false},
		{1000, 200, 80, true},
		{1000, 199, 80, false},
		{0, 0, 80, false},
		{100, 150, 80, true}, // available above capacity is capped
		{100, 0, 100, true},
	}
	for _, tt := range tests {
		if got := lowReached(DiskStats{CapacityBytes: tt.capacity, AvailableBytes: tt.available}, tt.low); got != tt.want {
			t.Errorf("lowReached(%d/%d, %d) = %v, want %v", tt.available, tt.capacity, tt.low, got, tt.want)
		}
	}
}
