package gc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/projection"
)

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
