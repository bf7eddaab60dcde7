package gc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
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

// TestImageGCEvaluateReplansOncePerGap: a change inside the pass gap (a
// second: DiskInterval is shorter) of the last plan moves the next age-out
// only when the gap ends.
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

// TestImageTriggerEpisode: usage reaching the high threshold starts an
// episode that goes on below it, with passes as candidates come of age or
// the state changes, until usage is at the low threshold.
func TestImageTriggerEpisode(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 60, MinAge: 2 * m}
	s := time.Second
	none := time.Duration(-1)
	youngAt := func(ds ...time.Duration) ImagePlan {
		plan := ImagePlan{Triggered: true}
		for _, d := range ds {
			plan.Keep = append(plan.Keep, ImageItem{Reason: ReasonTooYoung, EligibleAt: at(d)})
		}
		return plan
	}
	short := func(usage int) *ImagePass { return &ImagePass{UsageAfter: usage, Removed: []ImageOutcome{{}}} }
	atLow := &ImagePass{UsageAfter: 58, LowReached: true, Removed: []ImageOutcome{{}}}
	fruitless := &ImagePass{UsageAfter: 74}

	type step struct {
		at      time.Duration
		usage   int // 0: the sample failed
		seq     uint64
		want    string // trigger, "" for none
		pass    *ImagePass
		plan    ImagePlan
		episode time.Duration // start of the episode after the step; none
	}
	tests := []struct {
		name     string
		unsynced int // steps before the projection is synced
		high     int // overrides 85
		steps    []step
	}{
		{"a too-young image coming of age between the thresholds is freed, then the episode ends at low", 0, 0, []step{
			{at: 0, usage: 70, seq: 1, episode: none},
			{at: s, usage: 90, seq: 1, want: "disk", pass: short(74), plan: youngAt(5 * s), episode: s},
			{at: 2 * s, usage: 74, seq: 1, episode: s},
			{at: 5 * s, usage: 74, seq: 1, want: "episode", pass: atLow, plan: youngAt(), episode: none},
			{at: 6 * s, usage: 58, seq: 2, episode: none},
			// Later, between the thresholds again: no episode, no pass.
			{at: 9 * s, usage: 70, seq: 3, episode: none},
			{at: 2 * time.Minute, usage: 70, seq: 4, episode: none},
		}},
		{"candidates a few seconds apart: one pass each", 0, 0, []step{
			{at: 0, usage: 90, seq: 1, want: "disk", pass: short(80), plan: youngAt(3*s, 6*s, 9*s), episode: 0},
			{at: 3 * s, usage: 80, seq: 1, want: "episode", pass: short(72), plan: youngAt(6*s, 9*s), episode: 0},
			{at: 6 * s, usage: 72, seq: 1, want: "episode", pass: short(64), plan: youngAt(9 * s), episode: 0},
			{at: 8 * s, usage: 64, seq: 1, episode: 0},
			{at: 9 * s, usage: 64, seq: 1, want: "episode", pass: atLow, plan: youngAt(), episode: none},
		}},
		{"a change between the thresholds: a pass, not sooner than minGap", 0, 0, []step{
			{at: 0, usage: 90, seq: 1, want: "disk", pass: short(74), plan: youngAt(), episode: 0},
			{at: 500 * time.Millisecond, usage: 74, seq: 2, episode: 0},
			{at: s, usage: 74, seq: 2, want: "episode", pass: fruitless, plan: youngAt(), episode: 0},
			{at: s + 500*time.Millisecond, usage: 74, seq: 3, episode: 0},
			{at: 2 * s, usage: 74, seq: 3, want: "episode", pass: fruitless, plan: youngAt(), episode: 0},
			// Fruitless twice: the next change waits twice as long.
			{at: 3*s + 500*time.Millisecond, usage: 74, seq: 4, episode: 0},
			{at: 4 * s, usage: 74, seq: 4, want: "episode", pass: atLow, plan: youngAt(), episode: none},
		}},
		{"nothing left to free between the thresholds: a retry every minute", 0, 0, []step{
			{at: 0, usage: 90, seq: 1, want: "disk", pass: short(74), plan: youngAt(), episode: 0},
			{at: 59 * s, usage: 74, seq: 1, episode: 0},
			{at: 60 * s, usage: 74, seq: 1, want: "episode", pass: fruitless, plan: youngAt(), episode: 0},
		}},
		{"a sample at the low threshold ends it before the next candidate", 0, 0, []step{
			{at: 0, usage: 90, seq: 1, want: "disk", pass: short(74), plan: youngAt(5 * s), episode: 0},
			{at: s, usage: 60, seq: 1, episode: none},
			{at: 5 * s, usage: 61, seq: 1, episode: none},
		}},
		{"a failed sample keeps the episode", 0, 0, []step{
			{at: 0, usage: 90, seq: 1, want: "disk", pass: short(74), plan: youngAt(5 * s), episode: 0},
			{at: s, usage: 0, seq: 1, episode: 0},
			{at: 5 * s, usage: 74, seq: 1, want: "episode", pass: atLow, plan: youngAt(), episode: none},
		}},
		{"crossed before the sync: the first pass when synced, below the high threshold", 1, 0, []step{
			{at: 0, usage: 90, seq: 1, episode: 0},
			{at: s, usage: 80, seq: 2, want: "episode", pass: atLow, plan: youngAt(), episode: none},
		}},
		{"high 100 and no maximum age: no episode", 0, 100, []step{
			{at: 0, usage: 100, seq: 1, episode: none},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
			if tt.high != 0 {
				tr.policy.HighThresholdPercent = tt.high
			}
			for i, st := range tt.steps {
				now := at(st.at)
				tr.observe(now, disk(st.usage), st.usage != 0)
				got, ok := tr.due(now, st.seq, i >= tt.unsynced)
				if ok != (st.want != "") || got != st.want {
					t.Fatalf("step %d (%s): due = %q %v, want %q (%s)", i, st.at, got, ok, st.want, tr)
				}
				if ok {
					if st.pass == nil {
						t.Fatalf("step %d: a pass is due but the case gives none", i)
					}
					if pp := tr.passPolicy(p); !tr.above && pp.HighThresholdPercent != p.LowThresholdPercent {
						t.Fatalf("step %d: an episode pass below the high threshold plans with high %d, want the low %d", i,
							pp.HighThresholdPercent, p.LowThresholdPercent)
					}
					tr.passed(now, st.seq, st.plan, *st.pass)
				}
				wantEpisode := time.Time{}
				if st.episode != none {
					wantEpisode = at(st.episode)
				}
				if !tr.episodeAt.Equal(wantEpisode) {
					t.Fatalf("step %d (%s): episode %s, want %s (%s)", i, st.at, tr.episodeAt, wantEpisode, tr)
				}
			}
		})
	}
}

// TestImageTriggerEpisodeWake: during an episode below the high threshold
// the timer wakes the loop when the next candidate comes of age; after it,
// for nothing.
func TestImageTriggerEpisodeWake(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 60, MinAge: 2 * m}
	tr := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
	tr.observe(at(0), disk(90), true)
	tr.passed(at(0), 1, ImagePlan{Triggered: true, Keep: []ImageItem{{Reason: ReasonTooYoung, EligibleAt: at(7 * time.Second)}}},
		ImagePass{UsageAfter: 74})
	tr.observe(at(100*time.Millisecond), disk(74), true)
	if got := tr.wake(); !got.Equal(at(7 * time.Second)) {
		t.Fatalf("wake = %s, want the next candidate's coming of age at +7s", got)
	}
	tr.passed(at(7*time.Second), 1, ImagePlan{Triggered: true}, ImagePass{UsageAfter: 58, LowReached: true})
	if got := tr.wake(); !got.IsZero() {
		t.Fatalf("wake = %s after the episode ended", got)
	}
}

// TestImageTriggerPassPolicy: a pass plans with the low threshold as its
// trigger during an episode, and with the policy as it is otherwise.
func TestImageTriggerPassPolicy(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 60, MinAge: 2 * m}
	tr := &imageTrigger{policy: p, retry: time.Minute, minGap: time.Second}
	if got := tr.passPolicy(p); got.HighThresholdPercent != 85 {
		t.Fatalf("no episode: high %d", got.HighThresholdPercent)
	}
	tr.observe(at(0), disk(90), true)
	tr.observe(at(time.Second), disk(74), true)
	got := tr.passPolicy(p)
	if got.HighThresholdPercent != 60 || got.LowThresholdPercent != 60 {
		t.Fatalf("episode: thresholds %d/%d, want 60/60", got.HighThresholdPercent, got.LowThresholdPercent)
	}
	// Planned at 74%, the pass frees down to the low threshold.
	plan := PlanImages(nil, DiskStats{CapacityBytes: 100, AvailableBytes: 26}, got, at(time.Second))
	if !plan.Triggered || plan.AmountToFree != 14 {
		t.Fatalf("episode plan: triggered %v, amount to free %d, want true, 14", plan.Triggered, plan.AmountToFree)
	}
	tr.observe(at(2*time.Second), disk(60), true)
	if got := tr.passPolicy(p); got.HighThresholdPercent != 85 {
		t.Fatalf("after the episode: high %d", got.HighThresholdPercent)
	}
}

// Run's timers, in the order it creates them.
const (
	timerTick = iota
	timerWake
	timerDebounce
)

// waitArm waits until timer of c is armed at want.
func waitArm(t *testing.T, c *clock.Fake, timer int, want time.Time) {
	t.Helper()
	deadline := time.After(guard)
	for {
		select {
		case a := <-c.Arms():
			if a.Timer == timer && a.At.Equal(want) {
				return
			}
		case <-deadline:
			t.Fatalf("timer %d not armed at %s", timer, want)
		}
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

// loopHarness runs an ImageGC's loop over a real projection.Live on a
// clock.Fake; nothing sleeps.
type loopHarness struct {
	g     *ImageGC
	live  *projection.Live
	clock *clock.Fake
	disk  *countingDisk
	rt    *fakeRuntime
	pub   *imagePublisher
	o     ImageGCOptions
	gap   time.Duration // the spacing of disk samples idle expects
}

// startImageLoop starts Run with o (its Projection, Runtime, Disk, Clock
// and Publisher are the harness's) over evs, and waits for the first
// evaluation to end.
func startImageLoop(t *testing.T, o ImageGCOptions, capacity, available uint64, evs ...events.Event) *loopHarness {
	t.Helper()
	return startImageLoopGap(t, o, capacity, available, 0, evs...)
}

// startImageLoopGap is startImageLoop on a disk whose samples are gap
// apart (0: DiskInterval, as on any disk the fill rate crosses in less).
func startImageLoopGap(t *testing.T, o ImageGCOptions, capacity, available uint64, gap time.Duration, evs ...events.Event) *loopHarness {
	t.Helper()
	return startImageLoopWith(t, o, nil, capacity, available, gap, evs...)
}

// startImageLoopWith is startImageLoopGap with deps changed by mod (nil:
// none) before the ImageGC is made.
func startImageLoopWith(t *testing.T, o ImageGCOptions, mod func(*ImageGCDeps), capacity, available uint64, gap time.Duration, evs ...events.Event) *loopHarness {
	t.Helper()
	h := &loopHarness{gap: gap, clock: clock.NewFake(at(time.Hour)), disk: &countingDisk{fakeDisk: fakeDisk{capacity: capacity, available: available}},
		pub: &imagePublisher{}}
	h.rt = newFakeRuntime(&h.disk.fakeDisk)
	live, err := projection.NewLive(projection.LiveOptions{Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.live = live
	o.Clock = h.clock
	d := ImageGCDeps{Projection: live, Runtime: h.rt, Disk: h.disk, Publisher: h.pub}
	if !o.DryRun {
		d.Deletes = testDeletes1(t, h.pub, h.rt)
	}
	if mod != nil {
		mod(&d)
	}
	h.g = mustImageGC(t, d, o)
	h.o = h.g.o
	if h.gap == 0 {
		h.gap = h.o.DiskInterval
	}
	live.Apply(evs...)
	runLoop(t, h.g.Run)
	h.idle(t)
	return h
}

// idle waits for the evaluation under way to end: the last thing Run does
// after one is to arm the next disk sample, h.gap from now.
func (h *loopHarness) idle(t *testing.T) {
	t.Helper()
	waitArm(t, h.clock, timerTick, h.clock.Now().Add(h.gap))
}

// step moves the clock by d and, if a timer fired, waits for the
// evaluation it leads to.
func (h *loopHarness) step(t *testing.T, d time.Duration) {
	t.Helper()
	if h.clock.Step(d) > 0 {
		h.idle(t)
	}
}

// change applies evs as containerd's events would arrive and waits for the
// evaluation the debounce leads to.
func (h *loopHarness) change(t *testing.T, evs ...events.Event) {
	t.Helper()
	h.live.Apply(evs...)
	waitArm(t, h.clock, timerDebounce, h.clock.Now().Add(h.o.Debounce))
	h.step(t, h.o.Debounce)
}

// removed applies the deletion of every name of the images the runtime
// removed since the last call, as containerd's events would report them.
func (h *loopHarness) removed(t *testing.T, names map[string]string, seen *int) {
	t.Helper()
	var evs []events.Event
	for _, d := range h.rt.Removed()[*seen:] {
		evs = append(evs, events.ImageDeleted{At: h.clock.Now(), Name: names[d]})
	}
	*seen = len(h.rt.Removed())
	if len(evs) > 0 {
		h.change(t, evs...)
	}
}

// TestImageGCEpisode: usage crosses the high threshold while two of four
// candidates are younger than the minimum age; the first pass frees the
// two eligible ones and leaves usage between the thresholds. Each of the
// others is freed in a pass of the same episode when it comes of age, and
// the second brings usage to the low threshold: the episode ends there,
// and a later change between the thresholds runs no pass.
func TestImageGCEpisode(t *testing.T) {
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 60, MinAge: 2 * m}
	crossing := at(time.Hour + 100*time.Millisecond)
	// a and b are old; c and d come of age 5 s and 10 s after the crossing.
	firstSeen := map[string]time.Time{"a": at(0), "b": at(0), "c": crossing.Add(5*time.Second - p.MinAge),
		"d": crossing.Add(10*time.Second - p.MinAge)}
	names := map[string]string{}
	var evs []events.Event
	for _, n := range []string{"a", "b", "c", "d"} {
		name := "example.test/" + n + ":1"
		names[digestOf(n)] = name
		evs = append(evs, events.ImageUpserted{At: firstSeen[n], Name: name, Digest: digestOf(n), Size: 8 * mib})
	}
	evs = append(evs, events.Synced{At: at(time.Hour)})
	h := startImageLoop(t, ImageGCOptions{Policy: p, DiskInterval: 100 * time.Millisecond}, 100*mib, 30*mib, evs...) // 70%
	for _, n := range []string{"a", "b", "c", "d"} {
		h.rt.Add(digestOf(n), 8*mib, names[digestOf(n)])
	}
	seen := 0
	if st := h.g.Status(); st.Passes != 0 || !st.Episode.IsZero() {
		t.Fatalf("below the high threshold: %d passes, episode %s", st.Passes, st.Episode)
	}

	// A file written straight to the image filesystem: no event, the next
	// disk sample (DiskInterval later) sees it.
	h.disk.Fill(20 * mib) // 90%
	h.step(t, h.o.DiskInterval)
	st := h.g.Status()
	if st.Passes != 1 || st.LastPass.Trigger != "disk" || !st.Episode.Equal(crossing) {
		t.Fatalf("after the crossing: %d passes, last %+v, episode %s", st.Passes, st.LastPass, st.Episode)
	}
	if got, want := h.rt.Removed(), []string{digestOf("a"), digestOf("b")}; !slices.Equal(got, want) {
		t.Fatalf("first pass removed %v, want a and b", got)
	}
	if st.LastPass.UsageAfter != 74 || st.LastPass.LowReached {
		t.Fatalf("first pass ended at %d%% (low reached %v), want 74%%, between the thresholds", st.LastPass.UsageAfter, st.LastPass.LowReached)
	}
	h.removed(t, names, &seen)
	if st := h.g.Status(); st.Passes != 1 {
		t.Fatalf("the removals' own events ran a pass within the pass gap: %+v", st.LastPass)
	}
	if got, want := h.g.Status().NextWake, firstSeen["c"].Add(p.MinAge); !got.Equal(want) {
		t.Fatalf("next wake %s, want c's coming of age %s", got, want)
	}

	// c comes of age 5 s after the crossing: freed in the episode.
	h.step(t, firstSeen["c"].Add(p.MinAge).Sub(h.clock.Now()))
	st = h.g.Status()
	if st.Passes != 2 || st.LastPass.Trigger != "episode" {
		t.Fatalf("c came of age at %d%% during the episode: %d passes, last %+v", st.Usage, st.Passes, st.LastPass)
	}
	if got := h.rt.Removed(); !slices.Equal(got, []string{digestOf("a"), digestOf("b"), digestOf("c")}) {
		t.Fatalf("removed %v, want a, b, then c", got)
	}
	if st.LastPass.UsageAfter != 66 || !st.Episode.Equal(crossing) {
		t.Fatalf("after c: usage %d%%, episode %s; want 66%% and the episode going on", st.LastPass.UsageAfter, st.Episode)
	}
	h.removed(t, names, &seen)

	// d comes of age 5 s later: freed, and usage reaches the low threshold.
	h.step(t, firstSeen["d"].Add(p.MinAge).Sub(h.clock.Now()))
	st = h.g.Status()
	if st.Passes != 3 || st.LastPass.Trigger != "episode" || !st.LastPass.LowReached || st.LastPass.UsageAfter != 58 {
		t.Fatalf("d came of age: %d passes, last %+v", st.Passes, st.LastPass)
	}
	if !st.Episode.IsZero() {
		t.Fatalf("the episode goes on at the low threshold: %s", st.Episode)
	}
	h.removed(t, names, &seen)

	// Later, a change between the thresholds (a file written, an eligible
	// image imported): no episode, no pass, for minutes.
	h.disk.Fill(12 * mib) // 70%
	h.rt.Add(digestOf("e"), 8*mib, "example.test/e:1")
	h.change(t, events.ImageUpserted{At: at(0), Name: "example.test/e:1", Digest: digestOf("e"), Size: 8 * mib})
	for range 3 {
		h.step(t, time.Minute)
	}
	if st := h.g.Status(); st.Passes != 3 || !st.Episode.IsZero() || st.Usage != 70 {
		t.Fatalf("below the high threshold after the episode: %d passes (last %+v), episode %s, usage %d%%", st.Passes, st.LastPass,
			st.Episode, st.Usage)
	}
	if got := len(h.rt.Removed()); got != 4 {
		t.Fatalf("removed %v after the episode", h.rt.Removed())
	}
}

// TestImageGCRunCoalescesChanges: a burst of projection changes within
// the debounce leads to one evaluation, not one per change nor one more
// for the changes the evaluation already covered; a change after it leads
// to the next.
func TestImageGCRunCoalescesChanges(t *testing.T) {
	h := startImageLoop(t, ImageGCOptions{Policy: policy8070}, 100*mib, 90*mib)
	start := h.disk.samples.Load()
	for i := range 20 {
		h.live.Apply(pull(time.Duration(i), fmt.Sprintf("example.test/burst-%d:1", i), digestOf(fmt.Sprint(i)), mib))
	}
	waitArm(t, h.clock, timerDebounce, h.clock.Now().Add(h.o.Debounce))
	h.step(t, h.o.Debounce)
	if n := h.disk.samples.Load() - start; n != 1 {
		t.Fatalf("a burst of 20 changes took %d evaluations, want 1", n)
	}
	if len(h.g.changes) != 0 {
		t.Fatal("a change the evaluation covered is still signalled: it would lead to another")
	}
	h.change(t, pull(time.Minute, "example.test/later:1", digestOf("l"), mib))
	if n := h.disk.samples.Load() - start; n != 2 {
		t.Fatalf("a change after the burst's evaluation: %d evaluations in all, want 2", n)
	}
}

// TestImageGCRunSamplesEveryInterval: with nothing else going on, the
// loop samples the disk once per DiskInterval, and a crossing no event
// announces is acted on at the first sample after it.
func TestImageGCRunSamplesEveryInterval(t *testing.T) {
	h := startImageLoop(t, ImageGCOptions{Policy: policy8070}, 100*mib, 50*mib, events.Synced{At: at(time.Hour)})
	if h.o.DiskInterval != DefaultDiskInterval || DefaultDiskInterval > 250*time.Millisecond {
		t.Fatalf("disk interval %s, default %s: an unannounced crossing must be seen within 250 ms", h.o.DiskInterval, DefaultDiskInterval)
	}
	start := h.disk.samples.Load()
	for range 10 {
		h.step(t, h.o.DiskInterval)
	}
	if n := h.disk.samples.Load() - start; n != 10 {
		t.Fatalf("%d samples in 10 intervals", n)
	}
	h.disk.Fill(45 * mib) // 95%, no event
	h.step(t, h.o.DiskInterval)
	if st := h.g.Status(); st.Passes != 1 || st.LastPass.Trigger != "disk" || !st.LastPass.Start.Equal(h.clock.Now()) {
		t.Fatalf("crossing not acted on at the next sample: %+v", st.LastPass)
	}
}

// TestImageTriggerNextSample: samples come every DiskInterval near the high
// threshold and during an episode, further apart as the headroom grows, and
// never further than a second (or DiskInterval when longer).
func TestImageTriggerNextSample(t *testing.T) {
	const gib = 1 << 30
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 60, MinAge: 2 * m}
	on := func(availableGiB uint64) DiskStats {
		return DiskStats{CapacityBytes: 100 * gib, AvailableBytes: availableGiB * gib}
	}
	ms := time.Millisecond
	tests := []struct {
		name     string
		interval time.Duration
		high     int
		samples  []DiskStats // the last is the one the next sample follows
		failed   bool
		want     time.Duration
	}{
		{"far from the threshold: a second", 100 * ms, 0, []DiskStats{on(50)}, false, time.Second},
		{"4 GiB from it: a second", 100 * ms, 0, []DiskStats{on(20)}, false, time.Second},
		{"2 GiB from it: half a second", 100 * ms, 0, []DiskStats{on(18)}, false, 500 * ms},
		{"one byte from it: DiskInterval", 100 * ms, 0, []DiskStats{on(16)}, false, 100 * ms},
		{"above it", 100 * ms, 0, []DiskStats{on(10)}, false, 100 * ms},
		{"in an episode below it", 100 * ms, 0, []DiskStats{on(10), on(30)}, false, 100 * ms},
		{"after the episode", 100 * ms, 0, []DiskStats{on(10), on(40)}, false, time.Second},
		{"a small disk is always near", 100 * ms, 0, []DiskStats{{CapacityBytes: 1 << 30, AvailableBytes: 1 << 29}}, false, 100 * ms},
		{"statfs failed", 100 * ms, 0, []DiskStats{{}}, true, time.Second},
		{"threshold GC off", 100 * ms, 100, []DiskStats{on(1)}, false, time.Second},
		{"DiskInterval longer than a second", 5 * time.Second, 0, []DiskStats{on(16)}, false, 5 * time.Second},
		{"DiskInterval 200ms, far", 200 * ms, 0, []DiskStats{on(50)}, false, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := p
			if tt.high != 0 {
				pol.HighThresholdPercent = tt.high
			}
			tr := newImageTrigger(ImageGCOptions{Policy: pol, Retry: time.Minute, DiskInterval: tt.interval})
			for i, d := range tt.samples {
				tr.observe(at(time.Duration(i)*time.Second), d, !tt.failed)
			}
			if got := tr.nextSample(); got != tt.want {
				t.Fatalf("next sample in %s, want %s (%s)", got, tt.want, &tr)
			}
		})
	}
}

// TestImageGCRunSamplesFarFromThreshold: on a large disk far from the high
// threshold the loop samples once a second; near it, every DiskInterval.
func TestImageGCRunSamplesFarFromThreshold(t *testing.T) {
	const gib = 1 << 30
	h := startImageLoopGap(t, ImageGCOptions{Policy: policy8070}, 100*gib, 50*gib, time.Second, events.Synced{At: at(time.Hour)})
	start := h.disk.samples.Load()
	h.step(t, h.o.DiskInterval) // nothing due
	if n := h.disk.samples.Load() - start; n != 0 {
		t.Fatalf("%d samples %s after the last, 50%% used of 100 GiB", n, h.o.DiskInterval)
	}
	h.step(t, time.Second-h.o.DiskInterval)
	if n := h.disk.samples.Load() - start; n != 1 {
		t.Fatalf("%d samples a second after the last", n)
	}
	h.disk.Fill(34 * gib) // 84%: one byte from the high threshold, the next sample in DiskInterval
	h.gap = h.o.DiskInterval
	h.step(t, time.Second)
	if st := h.g.Status(); st.Passes != 0 || st.Usage != 84 {
		t.Fatalf("at 84%%: %d passes, usage %d%%", st.Passes, st.Usage)
	}
	h.disk.Fill(1) // 85%, no event
	h.step(t, h.o.DiskInterval)
	if st := h.g.Status(); st.Passes != 1 || st.LastPass.Trigger != "disk" {
		t.Fatalf("crossing not acted on at the next sample, DiskInterval later: %+v", st.LastPass)
	}
}

// TestImageTriggerResumesAfterUnsettled: a pass cut short by a delete
// whose outcome was unknown is resumed after minGap, backing off while
// passes keep being cut short, and no more once one is not (the images
// it skipped wait for no projection change).
func TestImageTriggerResumesAfterUnsettled(t *testing.T) {
	tr := newImageTrigger(ImageGCOptions{Policy: ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MaxAge: time.Hour}, Retry: time.Minute})
	now := at(time.Hour)
	cut := ImagePass{Skipped: []ImageOutcome{{Digest: digestOf("b"), Reason: ReasonUnsettled}}}
	tr.passed(now, 1, ImagePlan{Now: now}, cut)
	if why, ok := tr.due(now, 1, true); ok {
		t.Fatalf("due at once (%s), want after minGap", why)
	}
	if got, want := tr.wake(), now.Add(tr.minGap); !got.Equal(want) {
		t.Errorf("wake %s, want %s", got, want)
	}
	now = now.Add(tr.minGap)
	if why, ok := tr.due(now, 1, true); !ok || why != "resume" {
		t.Fatalf("after minGap: %q %v, want resume", why, ok)
	}
	tr.passed(now, 1, ImagePlan{Now: now}, cut) // still unsettled: back off
	if got, want := tr.wake(), now.Add(2*tr.minGap); !got.Equal(want) {
		t.Errorf("wake after a second cut-short pass %s, want %s", got, want)
	}
	now = now.Add(2 * tr.minGap)
	tr.passed(now, 1, ImagePlan{Now: now}, ImagePass{}) // settled: it went
	if why, ok := tr.due(now.Add(time.Hour), 1, true); ok {
		t.Errorf("due (%s) after a pass that was not cut short", why)
	}
}
