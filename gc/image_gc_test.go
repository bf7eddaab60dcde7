package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// fakeProjection serves a State the test mutates between calls.
type fakeProjection struct {
	state *projection.State
	subs  int
}

var (
	_ imageProjection = (*fakeProjection)(nil)
	_ imageProjection = (*projection.Live)(nil)
	_ imageProjection = (*projection.Spaces)(nil)
)

func (p *fakeProjection) ViewAll(fn func([]*projection.State)) { fn([]*projection.State{p.state}) }
func (p *fakeProjection) Synced() bool                         { return p.state.Synced }
func (p *fakeProjection) Subscribe() <-chan struct{} {
	p.subs++
	return make(chan struct{})
}

// imagePublisher records actions.
type imagePublisher struct {
	mu      sync.Mutex
	actions []Action
}

func (p *imagePublisher) Publish(a Action) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = append(p.actions, a)
	return nil
}

func (p *imagePublisher) keys(kind, action string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.actions {
		if a.Kind == kind && a.Action == action {
			out = append(out, a.Key)
		}
	}
	return out
}

// fakeClock is a settable clock.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time                  { return c.now }
func (c *fakeClock) Step(d time.Duration)            { c.now = c.now.Add(d) }
func (c *fakeClock) Set(t time.Time)                 { c.now = t }
func (c *fakeClock) Since(d time.Duration) time.Time { return c.now.Add(-d) }

func newImageGC(t *testing.T, n *node, p ImagePolicy, mod func(*ImageGCOptions)) (*ImageGC, *imagePublisher, *fakeClock, *prometheus.Registry) {
	t.Helper()
	pub, clk, reg := &imagePublisher{}, &fakeClock{now: at(time.Hour)}, prometheus.NewRegistry()
	o := ImageGCOptions{Projection: &fakeProjection{state: n.state}, Runtime: n.rt, Disk: n.disk, Policy: p,
		Now: clk.Now, Publisher: pub, Registerer: reg}
	if mod != nil {
		mod(&o)
	}
	if !o.DryRun && o.Deletes == nil {
		o.Deletes = testDeletes1(t, o.Publisher, n.rt)
	}
	return NewImageGC(o), pub, clk, reg
}

func TestImageGCPassPublishesAndCounts(t *testing.T) {
	n := newNode()
	g, pub, clk, reg := newImageGC(t, n, policy8070, nil)
	pass := g.Pass(context.Background(), "disk")

	wantRemoved := []string{digestOf("a"), digestOf("b")}
	var got []string
	for _, o := range pass.Removed {
		got = append(got, o.Digest)
	}
	if !slices.Equal(got, wantRemoved) {
		t.Fatalf("removed %v, want %v", got, wantRemoved)
	}
	if !pass.Triggered || !pass.LowReached || pass.UsageAfter != 74 || pass.FreedBytes != 16*mib || pass.EstimatedBytes != 8*mib {
		t.Errorf("pass %+v", pass)
	}
	// Keys: digest@firstSeen for a removal; plus the pass start for a skip.
	first := strconv.FormatInt(at(0).UnixNano(), 10)
	if k := pub.keys("image", ActionRemoved); !slices.Equal(k, []string{digestOf("a") + "@" + first, digestOf("b") + "@" + first}) {
		t.Errorf("removed keys %v", k)
	}
	passKey := "image@" + strconv.FormatInt(clk.now.UnixNano(), 10)
	if k := pub.keys("image", ActionSkipped); !slices.Equal(k, []string{digestOf("c") + "@" + first + "/" + strconv.FormatInt(clk.now.UnixNano(), 10)}) {
		t.Errorf("skipped keys %v", k)
	}
	if s, c := pub.keys("gc", "started"), pub.keys("gc", "completed"); !slices.Equal(s, []string{passKey}) || !slices.Equal(c, []string{passKey}) {
		t.Errorf("pass keys started %v completed %v, want %s", s, c, passKey)
	}
	if v := testutil.ToFloat64(g.m.removed.WithLabelValues("", "space")); v != 2 {
		t.Errorf("images removed metric = %v", v)
	}
	if v := testutil.ToFloat64(g.m.bytes.WithLabelValues("", "space", "measured")); v != 16*mib {
		t.Errorf("measured bytes metric = %v", v)
	}
	if v := testutil.ToFloat64(g.m.skipped.WithLabelValues(string(ReasonLowReached))); v != 1 {
		t.Errorf("skips metric = %v", v)
	}
	if n, err := testutil.GatherAndCount(reg, "gcagent_image_gc_passes_total"); err != nil || n != 1 {
		t.Errorf("passes series %d %v", n, err)
	}
	st := g.Status()
	if st.Passes != 1 || st.LastPass == nil || len(st.LastPass.Removed) != 2 {
		t.Errorf("status %+v", st)
	}

	// The same pass again (a retry after a crash) publishes the same keys.
	n2 := newNode()
	g2, pub2, _, _ := newImageGC(t, n2, policy8070, nil)
	g2.Pass(context.Background(), "disk")
	if !slices.Equal(pub.keys("image", ActionRemoved), pub2.keys("image", ActionRemoved)) {
		t.Errorf("keys not deterministic: %v vs %v", pub.keys("image", ActionRemoved), pub2.keys("image", ActionRemoved))
	}
}

func TestImageGCFailedPass(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("a"), errors.New("boom"))
	g, pub, _, _ := newImageGC(t, n, policy8070, nil)
	pass := g.Pass(context.Background(), "disk")
	if pass.Error == "" || len(pub.keys("gc", "failed")) != 1 || len(pub.keys("gc", "completed")) != 0 {
		t.Fatalf("pass error %q, failed %v", pass.Error, pub.keys("gc", "failed"))
	}
}

func TestImageGCSandboxImages(t *testing.T) {
	t.Run("learned from CRI", func(t *testing.T) {
		n := newNode() // a is the least recently used
		calls := 0
		g, _, _, _ := newImageGC(t, n, policy8070, func(o *ImageGCOptions) {
			o.LearnSandboxImages = func(context.Context) ([]string, error) {
				calls++
				return []string{"example.test/a:1"}, nil
			}
		})
		pass := g.Pass(context.Background(), "disk")
		if slices.Contains(n.rt.Removed(), digestOf("a")) {
			t.Fatalf("removed the sandbox image: %v", n.rt.Removed())
		}
		if len(pass.Removed) == 0 {
			t.Fatalf("removed nothing")
		}
		if st := g.Status(); !slices.Equal(st.SandboxImages, []string{"example.test/a:1"}) {
			t.Errorf("status sandbox images %v", st.SandboxImages)
		}
		g.Pass(context.Background(), "disk")
		if calls != 1 {
			t.Errorf("asked CRI %d times within the relearn interval", calls)
		}
	})
	t.Run("retried until CRI answers", func(t *testing.T) {
		n := newNode()
		calls := 0
		g, _, _, _ := newImageGC(t, n, policy8070, func(o *ImageGCOptions) {
			o.LearnSandboxImages = func(context.Context) ([]string, error) {
				calls++
				return nil, errors.New("cri: unavailable")
			}
		})
		g.Pass(context.Background(), "disk")
		g.Pass(context.Background(), "disk")
		if calls != 2 {
			t.Errorf("asked CRI %d times, want once per pass until it answers", calls)
		}
	})
	t.Run("image of a sandbox that is gone", func(t *testing.T) {
		n := newNode()
		// A pod ran on b's image as its sandbox, then went away.
		n.state.Apply(sandbox(2*h, "sb1", "uid-1"))
		n.state.Apply(events.ContainerUpserted{At: at(2 * h), ID: "sb1", Image: "example.test/b:1",
			CRIKind: projection.KindSandbox, PodUID: "uid-1", Created: at(2 * h)})
		g, _, _, _ := newImageGC(t, n, policy8070, nil)
		g.Pass(context.Background(), "disk") // sees the sandbox: in use anyway
		n.state.Apply(remove(3*h, "sb1"))
		n.disk.available = 0
		g.Pass(context.Background(), "disk")
		if slices.Contains(n.rt.Removed(), digestOf("b")) {
			t.Fatalf("removed an image pods were started from: %v", n.rt.Removed())
		}
	})
}

func TestImageGCDryRunDeletesNothing(t *testing.T) {
	n := newNode()
	g, pub, _, _ := newImageGC(t, n, policy8070, func(o *ImageGCOptions) { o.DryRun = true })
	pass := g.Pass(context.Background(), "disk")
	if len(n.rt.Removed()) != 0 || len(pass.Removed) != 0 {
		t.Fatalf("dry run removed %v", n.rt.Removed())
	}
	if got := len(pub.keys("image", ActionSkipped)); got != 3 {
		t.Errorf("published %d skips, want one per planned image (3)", got)
	}
}

func TestImageGCSubscribesAtConstruction(t *testing.T) {
	n := newNode()
	p := &fakeProjection{state: n.state}
	NewImageGC(ImageGCOptions{Projection: p, Runtime: n.rt, Disk: n.disk, Policy: policy8070})
	if p.subs != 1 {
		t.Fatalf("subscribed %d times", p.subs)
	}
}

// disk returns a 100-byte disk at usage percent.
func disk(usage int) DiskStats {
	return DiskStats{CapacityBytes: 100, AvailableBytes: uint64(100 - usage)}
}

func TestImageTrigger(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * m}
	newTrig := func() *imageTrigger { return &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second} }
	s := time.Second
	reachedLow := ImagePass{LowReached: true}
	short := ImagePass{}
	triggered := ImagePlan{Triggered: true}

	type step struct {
		at     time.Duration
		usage  int
		seq    uint64
		synced bool
		want   string // trigger, "" for none
		pass   *ImagePass
		plan   ImagePlan
	}
	tests := []struct {
		name  string
		high  int // overrides 85
		steps []step
	}{
		{"waits for sync, then runs", 0, []step{
			{at: 0, usage: 90, seq: 1, want: ""},
			{at: s, usage: 90, seq: 2, synced: true, want: "disk", pass: &reachedLow, plan: triggered},
		}},
		{"below high: nothing", 0, []step{
			{at: 0, usage: 84, seq: 1, synced: true, want: ""},
			{at: time.Hour, usage: 84, seq: 9, synced: true, want: ""},
		}},
		{"high 100 disables threshold GC", 100, []step{
			{at: 0, usage: 100, seq: 1, synced: true, want: ""},
		}},
		{"one pass per crossing once low is reached", 0, []step{
			{at: 0, usage: 86, seq: 1, synced: true, want: "disk", pass: &reachedLow, plan: triggered},
			{at: s, usage: 80, seq: 3, synced: true, want: ""},
			{at: 2 * s, usage: 86, seq: 4, synced: true, want: "disk", pass: &reachedLow, plan: triggered},
		}},
		{"short pass: reruns on a change, not faster than minGap", 0, []step{
			{at: 0, usage: 95, seq: 1, synced: true, want: "disk", pass: &short, plan: triggered},
			{at: 500 * time.Millisecond, usage: 95, seq: 2, synced: true, want: ""},
			{at: s, usage: 95, seq: 2, synced: true, want: "change", pass: &short, plan: triggered},
			{at: 2 * s, usage: 95, seq: 2, synced: true, want: ""},
			{at: 30 * s, usage: 95, seq: 2, synced: true, want: ""},
			{at: 61 * s, usage: 95, seq: 2, synced: true, want: "retry", pass: &short, plan: triggered},
		}},
		{"short pass with too-young images: when they come of age", 0, []step{
			{at: 0, usage: 95, seq: 1, synced: true, want: "disk", pass: &short, plan: ImagePlan{Triggered: true,
				Keep: []ImageItem{{Reason: ReasonTooYoung, EligibleAt: at(30 * s)}, {Reason: ReasonTooYoung, EligibleAt: at(20 * s)}}}},
			{at: 19 * s, usage: 95, seq: 1, synced: true, want: ""},
			{at: 20 * s, usage: 95, seq: 1, synced: true, want: "min-age", pass: &short, plan: triggered},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTrig()
			if tt.high != 0 {
				tr.policy.HighThresholdPercent = tt.high
			}
			for i, st := range tt.steps {
				now := at(st.at)
				tr.observe(now, disk(st.usage), true)
				got, ok := tr.due(now, st.seq, st.synced)
				if ok != (st.want != "") || got != st.want {
					t.Fatalf("step %d (%s): due = %q %v, want %q (%s)", i, st.at, got, ok, st.want, tr)
				}
				if ok && st.pass != nil {
					tr.passed(now, st.seq, st.plan, *st.pass)
				}
			}
		})
	}
}

func TestImageTriggerWake(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * m, MaxAge: time.Hour}
	tr := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
	tr.observe(at(0), disk(10), true)
	if !tr.wake().IsZero() {
		t.Fatalf("wake armed with nothing to wait for: %s", tr.wake())
	}
	// A plan whose earliest kept image ages out at +40m arms the timer there.
	tr.planned(1, ImagePlan{Now: at(0), NextAgeOut: at(40 * m)})
	if got := tr.wake(); !got.Equal(at(40 * m)) {
		t.Fatalf("wake = %s, want +40m", got)
	}
	if _, ok := tr.due(at(40*m-time.Nanosecond), 1, true); ok {
		t.Fatalf("due before the age-out")
	}
	if got, ok := tr.due(at(40*m), 1, true); !ok || got != "max-age" {
		t.Fatalf("due at the age-out = %q %v", got, ok)
	}
	tr.passed(at(40*m), 1, ImagePlan{Now: at(40 * m), NextAgeOut: at(70 * m)}, ImagePass{})
	if got := tr.wake(); !got.Equal(at(70 * m)) {
		t.Fatalf("re-armed at %s, want +70m", got)
	}
	// A plan with max-age images due now, right after a pass: not before minGap.
	tr.planned(2, ImagePlan{Now: at(40 * m), Delete: []ImageItem{{Reason: ReasonMaxAge}}})
	if got := tr.wake(); !got.Equal(at(40*m + time.Second)) {
		t.Fatalf("max-age due at %s, want one minGap after the last pass", got)
	}
	// Above the high threshold after a short pass with too-young images:
	// woken when the first comes of age, before the next age-out.
	tr2 := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
	tr2.observe(at(0), disk(99), true)
	tr2.passed(at(0), 1, ImagePlan{Now: at(0), Triggered: true, NextAgeOut: at(time.Hour),
		Keep: []ImageItem{{Reason: ReasonTooYoung, EligibleAt: at(90 * time.Second)}}}, ImagePass{})
	if got := tr2.wake(); !got.Equal(at(time.Minute)) {
		t.Fatalf("wake = %s, want the retry at +1m (before min-age at +90s)", got)
	}
	tr2.retry = time.Hour
	if got := tr2.wake(); !got.Equal(at(90 * time.Second)) {
		t.Fatalf("wake = %s, want min-age at +90s", got)
	}
}

// TestImageTriggerReplanGap: with a maximum age set, a churn re-plans the
// next age-out at most once per minGap, and the change a gap held back is
// re-planned when the timer wakes at its end.
func TestImageTriggerReplanGap(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MaxAge: time.Hour}
	tr := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
	tr.observe(at(0), disk(10), true)
	if !tr.replan(at(0), 1) {
		t.Fatal("first plan not due")
	}
	tr.planned(1, ImagePlan{Now: at(0), NextAgeOut: at(40 * m)})
	if tr.replan(at(time.Minute), 1) {
		t.Fatal("re-plan without a change")
	}
	ms := time.Millisecond
	tr.planned(1, ImagePlan{Now: at(0), NextAgeOut: at(40 * m)})
	for i, d := range []time.Duration{20 * ms, 40 * ms, 500 * ms, 999 * ms} {
		if tr.replan(at(d), uint64(2+i)) {
			t.Fatalf("re-plan %s after the last, inside minGap", d)
		}
		if got := tr.wake(); !got.Equal(at(time.Second)) {
			t.Fatalf("held-back change: wake = %s, want the end of minGap (+1s)", got)
		}
	}
	if !tr.replan(at(time.Second), 5) {
		t.Fatal("re-plan not due at the end of minGap")
	}
	tr.planned(5, ImagePlan{Now: at(time.Second), NextAgeOut: at(50 * m)})
	if got := tr.wake(); !got.Equal(at(50 * m)) {
		t.Fatalf("wake = %s after the re-plan, want the age-out at +50m", got)
	}
	// A pass is a plan too: a change right after it waits for minGap.
	tr.passed(at(2*time.Second), 6, ImagePlan{Now: at(2 * time.Second), NextAgeOut: at(50 * m)}, ImagePass{})
	if tr.replan(at(2*time.Second+ms), 7) || !tr.wake().Equal(at(3*time.Second)) {
		t.Fatalf("change right after a pass: re-planned or wake %s", tr.wake())
	}
	// Without a maximum age nothing is re-planned.
	tr.policy.MaxAge = 0
	if tr.replan(at(time.Hour), 8) || !tr.wake().Equal(at(50*m)) {
		t.Fatalf("re-plan without a maximum age (wake %s)", tr.wake())
	}
}

func TestImageTriggerReaction(t *testing.T) {
	tr := &imageTrigger{policy: policy8070, retry: time.Minute, minGap: time.Second}
	tr.observe(at(0), disk(50), true)
	if tr.reacted(at(time.Second)) {
		t.Fatal("reaction without a crossing")
	}
	tr.observe(at(10*time.Second), disk(90), true)
	tr.observe(at(11*time.Second), disk(90), true) // still above: same crossing
	if !tr.reacted(at(12*time.Second)) || !tr.crossedAt.Equal(at(10*time.Second)) {
		t.Fatalf("first delete not measured from the crossing at +10s (%s)", tr)
	}
	if tr.reacted(at(13 * time.Second)) {
		t.Fatal("second delete of the same crossing measured")
	}
	tr.observe(at(20*time.Second), disk(70), true)
	tr.observe(at(30*time.Second), disk(88), true)
	if !tr.reacted(at(31*time.Second)) || !tr.crossedAt.Equal(at(30*time.Second)) {
		t.Fatalf("new crossing not measured (%s)", tr)
	}
	tr.observe(at(40*time.Second), DiskStats{}, false)
	if tr.above {
		t.Fatal("a failed sample counts as above")
	}
}

// maxAgeGC is image GC with a 2h maximum age on a node with room to
// spare, evaluated once at +1h.
func maxAgeGC(t *testing.T) (*ImageGC, *node, *fakeClock) {
	n := newNode()
	n.disk.available = 90 * mib
	p := policy8070
	p.MaxAge = 2 * h
	g, _, clk, _ := newImageGC(t, n, p, nil)
	clk.Set(at(time.Hour))
	g.evaluate(context.Background())
	return g, n, clk
}

func TestImageGCEvaluateArmsMaxAge(t *testing.T) {
	g, n, clk := maxAgeGC(t)
	// a left at +1m1s: ages out just after +2h1m1s.
	want := at(2*h + m + time.Second + time.Nanosecond)
	if got := g.trig.wake(); !got.Equal(want) {
		t.Fatalf("wake = %s, want %s", got, want)
	}
	if len(n.rt.Removed()) != 0 {
		t.Fatalf("removed before the age-out: %v", n.rt.Removed())
	}
	clk.Set(want)
	g.evaluate(context.Background())
	if got := n.rt.Removed(); !slices.Equal(got, []string{digestOf("a")}) {
		t.Fatalf("removed %v at the age-out, want a", got)
	}
	if st := g.Status(); st.LastPass == nil || st.LastPass.Trigger != "max-age" {
		t.Fatalf("last pass %+v", st.LastPass)
	}
	if !strings.Contains(g.trig.String(), "ageout=") {
		t.Fatal("String")
	}
}

// TestImageGCEvaluateReplansOncePerGap: a change inside DiskInterval of the
// last plan moves the next age-out only when the gap ends.
func TestImageGCEvaluateReplansOncePerGap(t *testing.T) {
	g, n, clk := maxAgeGC(t)
	ageOutA, ageOutB := at(2*h+m+time.Second+time.Nanosecond), at(2*h+2*m+time.Second+time.Nanosecond)
	if got := g.Status().NextAgeOut; !got.Equal(ageOutA) {
		t.Fatalf("next age-out %s, want a's at %s", got, ageOutA)
	}
	n.state.Apply(native(time.Hour, "uses-a", "example.test/a:1")) // a is in use again
	clk.Step(20 * time.Millisecond)
	g.evaluate(context.Background())
	if got := g.Status().NextAgeOut; !got.Equal(ageOutA) {
		t.Fatalf("re-planned 20ms after the last plan: next age-out %s", got)
	}
	if got, want := g.trig.wake(), at(time.Hour+time.Second); !got.Equal(want) {
		t.Fatalf("wake = %s, want the end of the gap %s", got, want)
	}
	clk.Set(at(time.Hour + time.Second))
	g.evaluate(context.Background())
	if got := g.Status().NextAgeOut; !got.Equal(ageOutB) {
		t.Fatalf("next age-out %s at the end of the gap, want b's at %s", got, ageOutB)
	}
	if got := g.trig.wake(); !got.Equal(ageOutB) {
		t.Fatalf("wake = %s, want b's age-out", got)
	}
}

// kinds returns the kind.action of each published action, in order.
func (p *imagePublisher) kinds() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.actions {
		out = append(out, a.Kind+"."+a.Action)
	}
	return out
}

func (p *imagePublisher) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = nil
}

func TestImageGCRepeatedFruitlessPassPublishesNothing(t *testing.T) {
	n := newNode()
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		n.rt.Lease(digestOf(name), true) // every candidate is being pulled: nothing can go
	}
	var logs strings.Builder
	g, pub, clk, _ := newImageGC(t, n, policy8070, func(o *ImageGCOptions) { o.Log = zerolog.New(&logs) })
	news := []string{"gc.started", "image.skipped", "image.skipped", "image.skipped", "gc.completed"}

	g.Pass(context.Background(), "disk")
	if got := pub.kinds(); !slices.Equal(got, news) {
		t.Fatalf("first fruitless pass published %v, want %v", got, news)
	}
	pub.reset()
	clk.Step(time.Second)
	logs.Reset()
	pass := g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) != 0 {
		t.Fatalf("a pass that repeats the last fruitless one published %v", got)
	}
	if len(pass.Skipped) != 3 || g.Status().LastPass.Trigger != "change" {
		t.Errorf("the quiet pass is not reported: %+v", pass)
	}
	if v := testutil.ToFloat64(g.m.skipped.WithLabelValues(string(ReasonInFlightPull))); v != 6 {
		t.Errorf("skips metric = %v, want both passes counted (6)", v)
	}
	if v := testutil.ToFloat64(g.m.passes.WithLabelValues("change", "completed")); v != 1 {
		t.Errorf("passes metric = %v", v)
	}
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(l, `"level":"debug"`) {
			t.Errorf("quiet pass logged above debug: %s", l)
		}
	}
	if !strings.Contains(logs.String(), `"message":"image skipped"`) || !strings.Contains(logs.String(), `"unchanged":true`) {
		t.Errorf("quiet pass not logged at debug:\n%s", logs.String())
	}

	// Asked for by an operator: always published.
	clk.Step(time.Second)
	g.Pass(context.Background(), "manual")
	if got := pub.kinds(); !slices.Equal(got, news) {
		t.Fatalf("manual pass published %v, want %v", got, news)
	}
	pub.reset()

	// Another outcome is news: a pull ended, a goes; everything in order.
	n.rt.Lease(digestOf("a"), false)
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	want := []string{"gc.started", "image.removed", "image.skipped", "image.skipped", "gc.completed"}
	if got := pub.kinds(); !slices.Equal(got, want) {
		t.Fatalf("pass that removed a published %v, want %v", got, want)
	}
	pub.reset()

	// After a pass that removed something, a fruitless one is news again.
	n.disk.Fill(50 * mib)
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) == 0 || got[0] != "gc.started" || got[len(got)-1] != "gc.completed" {
		t.Fatalf("fruitless pass after a fruitful one published %v", got)
	}
	pub.reset()

	// A different skip reason is news too.
	n.rt.InjectError("leases", "", errors.New("leases: unavailable"))
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) == 0 || got[len(got)-1] != "gc.failed" {
		t.Fatalf("pass with a new outcome published %v", got)
	}
}

func TestImageTriggerChangeBackoff(t *testing.T) {
	tr := &imageTrigger{policy: policy8070, retry: time.Hour, minGap: time.Second}
	triggered, fruitless := ImagePlan{Triggered: true}, ImagePass{}
	now, seq := at(0), uint64(1)
	tr.observe(now, disk(95), true)
	if got, ok := tr.due(now, seq, true); !ok || got != "disk" {
		t.Fatalf("due = %q %v", got, ok)
	}
	tr.passed(now, seq, triggered, fruitless)
	for i, gap := range []time.Duration{1, 2, 4, 8, 16, 32, 60, 60} {
		gap *= time.Second
		seq++
		if got, ok := tr.due(now.Add(gap-time.Millisecond), seq, true); ok {
			t.Fatalf("fruitless pass %d: %q due %s after it, want %s (%s)", i+1, got, gap-time.Millisecond, gap, tr)
		}
		now = now.Add(gap)
		tr.observe(now, disk(95), true)
		if got, ok := tr.due(now, seq, true); !ok || got != "change" {
			t.Fatalf("fruitless pass %d: due = %q %v %s after it, want change (%s)", i+1, got, ok, gap, tr)
		}
		tr.passed(now, seq, triggered, fruitless)
	}

	// A pass that removes something: back to minGap.
	tr.passed(now, seq, triggered, ImagePass{Removed: []ImageOutcome{{}}})
	seq++
	if got, ok := tr.due(now.Add(time.Second), seq, true); !ok || got != "change" {
		t.Fatalf("after a removal: due = %q %v (%s)", got, ok, tr)
	}

	// Usage below the high threshold: back to minGap.
	tr.passed(now, seq, triggered, fruitless)
	tr.passed(now, seq, triggered, fruitless)
	if tr.changeGap != 2*time.Second {
		t.Fatalf("gap %s after two fruitless passes", tr.changeGap)
	}
	tr.observe(now.Add(time.Second), disk(50), true)
	if tr.changeGap != 0 {
		t.Fatalf("gap %s below the high threshold", tr.changeGap)
	}
}

func TestImageGCPolicy(t *testing.T) {
	n := newNode()
	n.state.Apply(sandbox(2*h, "sb1", "uid-1"))
	p := policy8070
	p.SandboxImages, p.KeepPatterns = []string{"cfg.test/pause:1"}, []string{"keep.test/*"}
	g, _, _, _ := newImageGC(t, n, p, func(o *ImageGCOptions) {
		o.LearnSandboxImages = func(context.Context) ([]string, error) { return []string{"cri.test/pause:2"}, nil }
	})
	if got := g.Policy(); !slices.Equal(got.SandboxImages, []string{"cfg.test/pause:1"}) || got.HighThresholdPercent != 85 {
		t.Fatalf("policy before a pass: %+v", got)
	}
	done := make(chan struct{})
	go func() { // Policy is safe while a pass runs
		defer close(done)
		for range 100 {
			_ = g.Policy()
		}
	}()
	g.Pass(context.Background(), "disk")
	<-done
	got := g.Policy()
	if want := []string{"cfg.test/pause:1", "cri.test/pause:2", "pause:3.10"}; !slices.Equal(got.SandboxImages, want) {
		t.Errorf("sandbox images %v, want %v", got.SandboxImages, want)
	}
	if !slices.Equal(got.KeepPatterns, p.KeepPatterns) || got.MinAge != p.MinAge {
		t.Errorf("policy %+v", got)
	}
	got.SandboxImages[0] = "changed"
	if g.Policy().SandboxImages[0] != "cfg.test/pause:1" {
		t.Error("Policy shares its slice with the caller")
	}
}

// countingDisk is a fakeDisk that counts its samples: each evaluation of
// the triggers takes one.
type countingDisk struct {
	fakeDisk
	samples atomic.Int64
}

func (d *countingDisk) Disk() (DiskStats, error) {
	d.samples.Add(1)
	return d.fakeDisk.Disk()
}

// TestImageGCRunCoalescesChanges: a burst of projection changes within
// the debounce leads to one evaluation, not one per change nor one more
// for the changes the evaluation already covered; a change after it leads
// to the next.
func TestImageGCRunCoalescesChanges(t *testing.T) {
	live, err := projection.NewLive(projection.LiveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := &countingDisk{fakeDisk: fakeDisk{capacity: 100 * mib, available: 90 * mib}}
	const debounce = 300 * time.Millisecond // the burst below takes microseconds
	g := NewImageGC(ImageGCOptions{Projection: live, Runtime: newFakeRuntime(&d.fakeDisk), Disk: d, Policy: policy8070,
		Debounce: debounce, DiskInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	settled := func(want string) int64 {
		t.Helper()
		// Quiet for three debounces: no evaluation is pending.
		n, since := d.samples.Load(), time.Now()
		deadline := since.Add(guard)
		for time.Since(since) < 3*debounce {
			if time.Now().After(deadline) {
				t.Fatalf("%s: disk sampled %d times and still going", want, n)
			}
			time.Sleep(10 * time.Millisecond)
			if m := d.samples.Load(); m != n {
				n, since = m, time.Now()
			}
		}
		return n
	}
	start := settled("start")
	for i := range 20 {
		live.Apply(pull(time.Duration(i), fmt.Sprintf("example.test/burst-%d:1", i), digestOf(fmt.Sprint(i)), mib))
	}
	if n := settled("burst") - start; n != 1 {
		t.Fatalf("a burst of 20 changes took %d evaluations, want 1", n)
	}
	live.Apply(pull(time.Minute, "example.test/later:1", digestOf("l"), mib))
	if n := settled("later") - start; n != 2 {
		t.Fatalf("a change after the burst's evaluation: %d evaluations in all, want 2", n)
	}
}
