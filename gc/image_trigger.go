package gc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// DefaultDiskInterval is how often image GC samples the image filesystem
// near the high threshold unless told otherwise: a crossing no containerd
// event announces (a file written straight to the filesystem) is seen
// within 100 ms. A sample costs a few microseconds (BenchmarkImageGCSample),
// but waking the loop costs far more (BenchmarkImageGCSampling), so far
// from the threshold samples are spaced out (nextSample).
const DefaultDiskInterval = 100 * time.Millisecond

// maxSampleGap is the longest spacing of disk samples (unless DiskInterval
// is longer): what the agent sampled at before it sampled faster near the
// threshold.
const maxSampleGap = time.Second

// assumedFillRate is the fastest, in bytes per second, the image
// filesystem is assumed to fill with nothing containerd reports: samples
// are spaced so that at this rate usage cannot reach the high threshold
// between two unless they are DiskInterval apart. A faster fill is seen up
// to a second late.
const assumedFillRate = 4 << 30

// minPassGap is the least spacing of passes on projection changes alone and
// of re-plans of the next age-out (a plan of 10,000 images takes tens of
// milliseconds): sampling faster must not plan faster.
const minPassGap = time.Second

// newImageTrigger returns the trigger of an ImageGC with options o (their
// defaults set).
func newImageTrigger(o ImageGCOptions) imageTrigger {
	return imageTrigger{policy: o.Policy, retry: o.Retry, minGap: max(o.DiskInterval, minPassGap), dryRun: o.DryRun,
		sampleMin: o.DiskInterval, sampleMax: max(o.DiskInterval, maxSampleGap)}
}

// Run evaluates the triggers until ctx ends; it returns nil then. It
// evaluates at start, when the next disk sample is due (nextSample, from
// the end of the last evaluation), when the trigger's timer is due, and
// Debounce after a projection change.
func (g *ImageGC) Run(ctx context.Context) error {
	clk := g.o.Clock
	tick := clk.NewTimer(time.Hour) // armed after each evaluation
	tick.Stop()
	defer tick.Stop()
	wake := clk.NewTimer(time.Hour)
	wake.Stop()
	defer wake.Stop()
	debounce := clk.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	// changes is nil while a debounce is armed: the evaluation it leads to
	// covers every change meanwhile, and a burst of events would otherwise
	// wake this loop once per batch for nothing.
	changes := g.changes
	g.learn(ctx, g.now())
	if g.d.Trace != nil {
		// The policy in force from the start, also on a node that never
		// reaches the high threshold (each pass records it again if it
		// changed).
		g.d.Trace.TracePolicy(g.now(), g.Policy())
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case reply := <-g.requests:
				d, ok := g.sample()
				g.trig.observe(g.now(), d, ok)
				reply <- g.Pass(ctx, "manual")
			case trigger := <-g.nudges:
				d, ok := g.sample()
				g.trig.observe(g.now(), d, ok)
				g.Pass(ctx, trigger)
			case trigger := <-g.rethinks:
				if g.keepHeld {
					d, ok := g.sample()
					g.trig.observe(g.now(), d, ok)
					g.Pass(ctx, trigger)
				}
			case <-tick.C():
			case <-wake.C():
			case <-changes:
				debounce.Reset(g.o.Debounce)
				changes = nil
				continue
			case <-debounce.C():
			}
		}
		// Every evaluation reads the state as it is now: it covers the
		// changes signalled so far, and a debounce armed for them.
		if changes == nil {
			debounce.Stop()
			changes = g.changes
		}
		drain(changes)
		g.evaluate(ctx)
		wake.Stop()
		at := g.trig.wake()
		if !at.IsZero() {
			wake.Reset(max(at.Sub(g.now()), time.Millisecond))
		}
		g.noteTrigger(at)
		tick.Reset(g.trig.nextSample()) // last: the loop is idle once the next sample is armed
	}
}

// Nudge asks Run for a pass soon with trigger (a policy input changed,
// such as the fleet keep list); it never blocks, and nudges coalesce.
func (g *ImageGC) Nudge(trigger string) {
	select {
	case g.nudges <- trigger:
	default:
	}
}

// Reconsider asks Run for a pass soon with trigger if the last plan kept
// an image only because the fleet keep list was never read (its first
// read, or the end of the wait for it, changes that); otherwise Run only
// evaluates its triggers. It never blocks, and calls coalesce.
func (g *ImageGC) Reconsider(trigger string) {
	select {
	case g.rethinks <- trigger:
	default:
	}
}

// RunNow asks Run for a pass now (trigger "manual") and returns it. It
// waits for a pass in progress to end first; it fails when ctx ends before
// Run answers (Run not running).
func (g *ImageGC) RunNow(ctx context.Context) (ImagePass, error) {
	reply := make(chan ImagePass, 1)
	select {
	case g.requests <- reply:
	case <-ctx.Done():
		return ImagePass{}, ctx.Err()
	}
	select {
	case p := <-reply:
		return p, nil
	case <-ctx.Done():
		return ImagePass{}, ctx.Err()
	}
}

func (g *ImageGC) sample() (DiskStats, bool) {
	d, err := g.d.Disk.Disk()
	return d, err == nil
}

// noteDiskError logs a failed measurement of the image filesystem, a run
// of them at a backoff with their count, and the first measurement that
// works again after them.
func (g *ImageGC) noteDiskError(now time.Time, err error) {
	if err == nil {
		if n, since := g.diskFailures.Recover(); n > 0 {
			g.o.Log.Info().Int("failures", n).Float64("unmeasured_s", now.Sub(since).Seconds()).
				Msg("image filesystem measured again")
		}
		return
	}
	if log, n := g.diskFailures.Fail(now, err.Error()); log {
		g.o.Log.Warn().Err(err).Int("failures", n).Msg("image filesystem not measured")
	}
}

// evaluate samples the disk, decides and runs a pass when one is due.
func (g *ImageGC) evaluate(ctx context.Context) {
	now := g.now()
	disk, err := g.d.Disk.Disk()
	g.noteDiskError(now, err)
	g.trig.observe(now, disk, err == nil)
	if err == nil && g.d.Trace != nil {
		g.d.Trace.TraceDisk(now, disk, "")
	}
	g.noteDisk(now, disk)
	var seq uint64
	var synced bool
	var plan ImagePlan
	synced = g.d.Projection.Synced()
	var replan bool
	g.d.Projection.ViewAll(func(states []*projection.State) {
		seq = projection.SeqOf(states)
		// The next age-out moves with the state; a plan of 10,000 images
		// takes tens of milliseconds, so it is re-planned at most once per
		// minGap however fast the state changes.
		if replan = synced && g.trig.replan(now, seq); replan {
			g.observeSandboxes(states)
			plan = PlanImages(states, disk, g.policy(), now)
		}
	})
	if replan {
		g.keepHeld = heldForKeepList(plan)
	}
	if replan {
		g.trig.planned(seq, plan)
		g.setNextAgeOut(plan.NextAgeOut)
	}
	if trigger, ok := g.trig.due(now, seq, synced); ok {
		g.Pass(ctx, trigger)
	}
}

func (g *ImageGC) noteDisk(now time.Time, d DiskStats) {
	usage, _ := usagePercent(d)
	g.m.usage.Set(float64(usage) / 100)
	g.mu.Lock()
	g.status.Disk, g.status.Usage, g.status.SampledAt = d, usage, now
	g.status.Above, g.status.CrossedAt, g.status.Episode = g.trig.above, g.trig.crossedAt, g.trig.episodeAt
	g.mu.Unlock()
}

// noteTrigger publishes the trigger's state after an evaluation (a pass
// may have ended the episode) and the instant its timer is armed at.
func (g *ImageGC) noteTrigger(wake time.Time) {
	g.mu.Lock()
	g.status.Above, g.status.CrossedAt, g.status.Episode = g.trig.above, g.trig.crossedAt, g.trig.episodeAt
	g.status.NextWake = wake
	g.mu.Unlock()
}

func (g *ImageGC) setNextAgeOut(t time.Time) {
	g.mu.Lock()
	g.status.NextAgeOut = t
	g.mu.Unlock()
}

// imageTrigger decides when a pass is due. It is pure: it holds what was
// observed and what the last pass found, and every method takes the time.
//
// A GC episode starts when a sample reaches the high threshold and ends
// when a sample or a pass finds usage at the low threshold. Within it,
// passes run when candidates may have become eligible: a min-age deadline
// passing, a projection change (a container gone, a name removed), and,
// while usage stays above the low threshold, every retry; below the high
// threshold they plan down to the low threshold (passPolicy) and their
// trigger is "episode". Once no candidate is left, the episode waits for
// one as a disk above the high threshold did before episodes: passes on
// changes back off to a minute, and a retry runs every minute.
type imageTrigger struct {
	policy    ImagePolicy
	retry     time.Duration // rerun a pass this soon during an episode
	minGap    time.Duration // at most one pass per minGap on projection changes alone
	dryRun    bool
	sampleMin time.Duration // disk samples near the high threshold and during an episode
	sampleMax time.Duration // disk samples far from it

	disk     DiskStats // the last sample
	measured bool      // it succeeded

	above     bool      // the last sample was at or above the high threshold
	crossedAt time.Time // when usage reached the high threshold; zero below it
	didReact  bool      // a delete happened since crossedAt
	episodeAt time.Time // when the GC episode under way started; zero when none

	passAt       time.Time     // end of the last pass; zero before the first
	passSeq      uint64        // projection seq the last pass planned from
	changeGap    time.Duration // spacing of change passes after fruitless ones in an episode; 0: minGap
	passShort    bool          // the last pass was triggered and did not reach low
	nextEligible time.Time     // earliest too-young image passing MinAge, when short

	// resumeAt is when a pass cut short by a delete whose outcome was
	// unknown runs again (it may be settled by then); resumeGap doubles
	// from minGap up to retry while passes keep being cut short.
	resumeAt  time.Time
	resumeGap time.Duration

	planSeq    uint64    // seq the next age-out was computed at
	planAt     time.Time // when it was computed
	stale      bool      // the state moved since, and the re-plan waits for minGap
	nextAgeOut time.Time // earliest max-age deadline; zero when none
}

// thresholdGC reports whether the policy runs threshold GC at all: not
// with high 100 and no maximum age (the kubelet's rule).
func (tr *imageTrigger) thresholdGC() bool {
	return tr.policy.HighThresholdPercent < 100 || tr.policy.MaxAge > 0
}

// observe takes a disk sample (ok false when statfs failed). A sample at or
// above the high threshold starts an episode; one at the low threshold
// ends it; a failed one changes nothing about it.
func (tr *imageTrigger) observe(now time.Time, d DiskStats, ok bool) {
	usage, valid := usagePercent(d)
	measured := ok && valid
	tr.disk, tr.measured = d, measured
	above := measured && tr.thresholdGC() && usage >= tr.policy.HighThresholdPercent
	if above && !tr.above {
		tr.crossedAt, tr.didReact = now, false
	}
	if !above {
		tr.crossedAt = time.Time{}
	}
	tr.above = above
	switch {
	case above && tr.episodeAt.IsZero():
		tr.episodeAt = now
	case !above && (!tr.thresholdGC() || measured && lowReached(d, tr.policy.LowThresholdPercent)):
		tr.endEpisode()
	}
}

// nextSample returns how long after the last sample the next is due:
// sampleMin during an episode, otherwise the time the headroom to the high
// threshold takes to fill at assumedFillRate, within sampleMin..sampleMax.
// At that rate usage cannot reach the high threshold unseen for longer than
// sampleMin.
func (tr *imageTrigger) nextSample() time.Duration {
	if !tr.measured || !tr.thresholdGC() {
		return tr.sampleMax
	}
	if tr.above || !tr.episodeAt.IsZero() {
		return tr.sampleMin
	}
	// Usage reaches high when available*100/capacity (rounded down) is
	// 100-high, that is below capacity*(101-high)/100.
	capacity := tr.disk.CapacityBytes
	mark := mulDiv(capacity, uint64(101-tr.policy.HighThresholdPercent), 100)
	headroom := min(tr.disk.AvailableBytes, capacity) - min(mark, tr.disk.AvailableBytes, capacity)
	fill := time.Duration(float64(headroom) / assumedFillRate * float64(time.Second))
	return min(max(fill, tr.sampleMin), tr.sampleMax)
}

// endEpisode forgets the episode and what its passes left to wait for.
func (tr *imageTrigger) endEpisode() {
	tr.episodeAt, tr.changeGap, tr.nextEligible = time.Time{}, 0, time.Time{}
}

// passPolicy is p as a pass plans with it now: during an episode threshold
// GC goes on down to the low threshold, so the plan triggers there.
func (tr *imageTrigger) passPolicy(p ImagePolicy) ImagePolicy {
	if !tr.episodeAt.IsZero() && p.LowThresholdPercent < p.HighThresholdPercent {
		p.HighThresholdPercent = p.LowThresholdPercent
	}
	return p
}

// replan reports whether the next age-out must be re-planned at projection
// seq: with a maximum age set, when the state moved since the last plan and
// that plan is at least minGap old. A change sooner than that is noted, and
// wake returns the end of the gap: a churn costs one plan per minGap, and
// an age-out it moved earlier is late by at most minGap.
func (tr *imageTrigger) replan(now time.Time, seq uint64) bool {
	tr.stale = false
	if tr.policy.MaxAge <= 0 || seq == tr.planSeq {
		return false
	}
	if !tr.planAt.IsZero() && now.Before(tr.planAt.Add(tr.minGap)) {
		tr.stale = true
		return false
	}
	return true
}

// planned records the next age-out of a plan made at projection seq. Max-age
// images in the plan are due now, but no sooner than minGap (retry in a dry
// run, which deletes nothing) after the last pass, so that a failing delete
// does not spin.
func (tr *imageTrigger) planned(seq uint64, plan ImagePlan) {
	tr.planSeq, tr.planAt, tr.nextAgeOut = seq, plan.Now, plan.NextAgeOut
	for _, it := range plan.Delete {
		if it.Reason == ReasonMaxAge {
			gap := tr.minGap
			if tr.dryRun {
				gap = tr.retry
			}
			tr.nextAgeOut = plan.Now
			if !tr.passAt.IsZero() {
				tr.nextAgeOut = later(plan.Now, tr.passAt.Add(gap))
			}
			break
		}
	}
}

// due reports whether a pass should run now, and its trigger: max-age; disk
// for a new crossing of the high threshold; then, during an episode, min-age,
// change and retry while above the high threshold and episode below it.
func (tr *imageTrigger) due(now time.Time, seq uint64, synced bool) (string, bool) {
	in := func(trigger string) (string, bool) {
		if !tr.above {
			return "episode", true
		}
		return trigger, true
	}
	switch {
	case !synced:
		return "", false
	case !tr.resumeAt.IsZero() && !now.Before(tr.resumeAt):
		return "resume", true // the last pass stopped at an unsettled delete
	case !tr.nextAgeOut.IsZero() && !now.Before(tr.nextAgeOut):
		return "max-age", true
	case !tr.above && tr.episodeAt.IsZero():
		return "", false
	case tr.above && (tr.passAt.IsZero() || tr.crossedAt.After(tr.passAt)):
		return "disk", true // a new crossing since the last pass
	case tr.passAt.Before(tr.episodeAt):
		return "episode", true // it started before the projection was synced
	case !tr.nextEligible.IsZero() && !now.Before(tr.nextEligible):
		return in("min-age")
	case seq != tr.passSeq && !now.Before(tr.passAt.Add(max(tr.minGap, tr.changeGap))):
		return in("change")
	case !now.Before(tr.passAt.Add(tr.retry)):
		return in("retry") // something else may have become deletable
	}
	return "", false
}

// changeGapMax bounds the backoff of change passes during an episode while
// they delete nothing.
const changeGapMax = time.Minute

// passed records a finished pass that planned from projection seq. Max-age
// images it could not delete (and, in a dry run, all of them) are retried
// when the projection changes. During an episode, each pass that removes
// nothing doubles the spacing of passes on changes alone, from minGap up to
// changeGapMax; a pass that reaches the low threshold ends the episode.
func (tr *imageTrigger) passed(now time.Time, seq uint64, plan ImagePlan, p ImagePass) {
	tr.passAt, tr.passSeq = now, seq
	switch {
	case len(p.Removed) > 0 || (!tr.above && tr.episodeAt.IsZero()):
		tr.changeGap = 0
	case tr.changeGap == 0:
		tr.changeGap = tr.minGap
	default:
		tr.changeGap = min(2*tr.changeGap, max(changeGapMax, tr.minGap))
	}
	tr.passShort = plan.Triggered && !p.LowReached
	tr.planSeq, tr.planAt, tr.nextAgeOut = seq, plan.Now, plan.NextAgeOut
	tr.nextEligible = time.Time{}
	if tr.passShort {
		for _, it := range plan.Keep {
			if it.Reason == ReasonTooYoung || it.Reason == ReasonKeepListUnread {
				earliest(&tr.nextEligible, it.EligibleAt)
			}
		}
	}
	if p.LowReached && p.UsageAfter < tr.policy.HighThresholdPercent {
		tr.above, tr.crossedAt = false, time.Time{}
		tr.endEpisode()
	}
	// A pass that stopped at a delete whose outcome was unknown (or was
	// settled after it measured the disk) is resumed, measuring again,
	// once the delete may be settled: its images wait for no other event.
	if slices.ContainsFunc(p.Skipped, func(o ImageOutcome) bool { return o.Reason == ReasonUnsettled }) {
		tr.resumeGap = min(max(2*tr.resumeGap, tr.minGap), max(tr.retry, tr.minGap))
		tr.resumeAt = now.Add(tr.resumeGap)
	} else {
		tr.resumeAt, tr.resumeGap = time.Time{}, 0
	}
}

// reacted reports whether a delete at t is the first since usage crossed
// the high threshold, and records it.
func (tr *imageTrigger) reacted(t time.Time) bool {
	if tr.crossedAt.IsZero() || tr.didReact {
		return false
	}
	tr.didReact = true
	return !t.Before(tr.crossedAt)
}

// wake returns the next instant a timer must evaluate at (zero for none):
// the next age-out, a re-plan that waits for minGap, and during an episode
// after a short pass, the end of min-age protection and the retry.
func (tr *imageTrigger) wake() time.Time {
	var t time.Time
	earliest(&t, tr.nextAgeOut)
	earliest(&t, tr.resumeAt)
	if tr.stale {
		earliest(&t, tr.planAt.Add(tr.minGap))
	}
	if !tr.episodeAt.IsZero() && !tr.passAt.IsZero() {
		earliest(&t, tr.nextEligible)
		earliest(&t, tr.passAt.Add(tr.retry))
	}
	return t
}

// String renders the trigger state for debugging.
func (tr *imageTrigger) String() string {
	return fmt.Sprintf("above=%v crossed=%s episode=%s pass=%s seq=%d gap=%s short=%v eligible=%s ageout=%s",
		tr.above, tr.crossedAt.Format(time.RFC3339Nano), tr.episodeAt.Format(time.RFC3339Nano), tr.passAt.Format(time.RFC3339Nano),
		tr.passSeq, tr.changeGap, tr.passShort, tr.nextEligible.Format(time.RFC3339Nano), tr.nextAgeOut.Format(time.RFC3339Nano))
}
