package gc

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/streak"
	"github.com/gcagent/gcagent/projection"
)

// imageProjection is the projection of every managed namespace as image GC
// reads it: *projection.Spaces (or, for one namespace, *projection.Live).
type imageProjection interface {
	ViewAll(fn func([]*projection.State))
	Synced() bool
	Subscribe() <-chan struct{}
}

// ImageGCDeps are what an ImageGC works through. Projection, Runtime and
// Disk are required; Deletes is, unless the GC is a dry run.
type ImageGCDeps struct {
	// Projection is the live projection (*projection.Spaces); NewImageGC
	// subscribes to it, so it must be called before the projection runs.
	Projection imageProjection
	// Runtime re-reads and deletes images (the node adapter).
	Runtime imageNode
	// Disk measures the image filesystem (node.ImageFS).
	Disk diskMeter
	// Deletes begins each delete's transaction (a *deletion.Manager),
	// whose commit stores the removal's event.
	Deletes deleteLog
	// Publisher receives one action per image skipped and per pass
	// (removals are the transactions' commits), except for a pass that
	// removes nothing and finds what the last one found (not triggered
	// manually): that one is only logged, at debug. Default Discard.
	Publisher Publisher
	// LearnSandboxImages, if set, asks the runtime for its sandbox images
	// (node.Runtime.SandboxImages). It is called before the first pass and
	// again every RelearnInterval; until it succeeds it is retried before
	// each pass.
	LearnSandboxImages func(ctx context.Context) ([]string, error)
	// Record, if set, journals an events.ImageCollected for each image
	// removed (not in a dry run), so that its return is noticed as a
	// regret (RegretReporter).
	Record Recorder
	// FleetKeep, if set, returns the fleet keep list now, with the state
	// of its read: each pass plans with it (Policy.FleetKeep; the rule of
	// an image its patterns keep says so: FleetRule), and the executor
	// keeps what it names since the plan. Nil: no fleet keep list (nothing
	// waits for one).
	FleetKeep func() KeepList
	// Trace, if set, records the disk measurements and the policy of the
	// passes for the usage trace (package trace, through the agent).
	Trace imageTracer
	// Ready, if set, closes once passes may run (the agent: deletes a
	// crash left settled, containerd's agent lock held, the fleet keep
	// list's first read tried). Until then Run measures the disk (its
	// metric, its log lines) and answers no request, nudge or trigger.
	Ready <-chan struct{}
}

// imageTracer records what image GC saw, for replays: every disk
// measurement (the tracer keeps what it needs), the one each pass planned
// with (trigger set), and the policy of each pass (Policy: configured and
// learned). It must not block.
type imageTracer interface {
	TraceDisk(at time.Time, d DiskStats, trigger string)
	TracePolicy(at time.Time, p ImagePolicy)
}

// ImageGCOptions configure an ImageGC; all but Policy have defaults.
type ImageGCOptions struct {
	// Policy is the image policy; it must pass Validate. Sandbox images
	// learned at run time are added to Policy.SandboxImages.
	Policy ImagePolicy
	// DryRun plans, logs and publishes but deletes nothing.
	DryRun bool
	// DiskInterval is how often the filesystem is sampled (statfs) near
	// the high threshold and during a GC episode; further from it, samples
	// are spaced by the time the headroom takes to fill at assumedFillRate,
	// up to a second (or DiskInterval when longer). Passes on projection
	// changes alone and re-plans of the next age-out are spaced by the
	// longer of it and a second. Default DefaultDiskInterval.
	DiskInterval time.Duration
	// Debounce coalesces projection changes before the disk is sampled.
	// Default 20ms.
	Debounce time.Duration
	// Retry is how soon a pass that could not reach the low threshold runs
	// again while nothing changes. Default 1m.
	Retry time.Duration
	// RelearnInterval is how often the sandbox images are asked again.
	// Default 5m.
	RelearnInterval time.Duration
	// RegretWindow is how long after a removal the image's return counts
	// as a regret. Default DefaultRegretWindow.
	RegretWindow time.Duration
	// Clock gives the time and the loop's timers. Default Go's.
	Clock      clock.Timers
	Log        zerolog.Logger
	Registerer prometheus.Registerer
	// Namespaces are the managed namespaces known at start: their metric
	// series exist from the start, at zero. Nil (--namespace=*): a
	// namespace's series appear with its first count.
	Namespaces []string
}

// The label values image GC's counters are created with at start.
var (
	imageTriggers    = []string{"disk", "max-age", "min-age", "retry", "change", "episode", "resume", "manual", "keep-list"}
	imagePassResults = []string{"completed", "failed"}
	imageRules       = []string{string(ReasonSpace), string(ReasonMaxAge)}
	imageSkipReasons = []string{string(ReasonDryRun), string(ReasonChanged), string(ReasonGone), string(ReasonLowReached),
		string(ReasonNotSynced), string(ReasonDeleteFailed), string(ReasonCanceled), string(ReasonInFlightPull), string(ReasonUnsettled),
		string(ReasonInUse), string(ReasonInUseByID), string(ReasonInUseBySnap), string(ReasonImageVolume), string(ReasonPinned),
		string(ReasonSandboxImage), string(ReasonKeepPattern)}
)

// ImagePass is the outcome of one image GC pass.
type ImagePass struct {
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Trigger string    `json:"trigger"` // disk, max-age, min-age, retry, change, episode, resume, manual
	DryRun  bool      `json:"dryRun,omitempty"`
	Synced  bool      `json:"synced"`
	// Disk, Usage and AmountToFree are the plan's, before any delete.
	Disk         DiskStats `json:"disk"`
	Usage        int       `json:"usage"`
	Triggered    bool      `json:"triggered"`
	AmountToFree int64     `json:"amountToFree"`
	// Planned is how many images the plan named for deletion.
	Planned int `json:"planned"`
	// Removed and Skipped are in the order processed.
	Removed        []ImageOutcome `json:"removed"`
	Skipped        []ImageOutcome `json:"skipped"`
	EstimatedBytes int64          `json:"estimatedBytes"`
	FreedBytes     int64          `json:"freedBytes"`
	// DiskAfter and UsageAfter are measured after the last delete.
	DiskAfter  DiskStats `json:"diskAfter"`
	UsageAfter int       `json:"usageAfter"`
	// LowReached says threshold GC brought usage to the low threshold;
	// meaningful when Triggered.
	LowReached bool      `json:"lowReached"`
	NextAgeOut time.Time `json:"nextAgeOut,omitzero"`
	// Shortfall and FirstEligibleAt say why a triggered plan frees less
	// than needed (ImagePlan.Shortfall) and when more becomes eligible.
	Shortfall       string    `json:"shortfall,omitempty"`
	FirstEligibleAt time.Time `json:"firstEligibleAt,omitzero"`
	Error           string    `json:"error,omitempty"`
}

// ImageGCStatus is the image GC's state for /status.
type ImageGCStatus struct {
	DryRun        bool       `json:"dryRun"`
	High          int        `json:"highThreshold"`
	Low           int        `json:"lowThreshold"`
	Disk          DiskStats  `json:"disk"`
	Usage         int        `json:"usage"`
	SampledAt     time.Time  `json:"sampledAt,omitzero"`
	Above         bool       `json:"aboveHigh"`
	CrossedAt     time.Time  `json:"crossedAt,omitzero"`
	Episode       time.Time  `json:"episode,omitzero"` // start of the GC episode under way; zero when none
	NextAgeOut    time.Time  `json:"nextAgeOut,omitzero"`
	NextWake      time.Time  `json:"nextWake,omitzero"`
	SandboxImages []string   `json:"sandboxImages"`
	Passes        int        `json:"passes"`
	LastPass      *ImagePass `json:"lastPass,omitempty"`
}

// ImageGC runs image GC: it samples the image filesystem (every
// DiskInterval near the high threshold) and on every projection change,
// runs a pass when usage reaches the high threshold, and another when the
// earliest max-age deadline passes. Reaching the high threshold starts a GC
// episode, which goes on until usage is at the low threshold: passes follow
// min-age deadlines and projection changes, below the high threshold too.
// While passes remove nothing, passes on projection changes alone back off
// to a minute. One goroutine (Run) owns the passes, so two never overlap.
// Status is safe for concurrent use.
type ImageGC struct {
	d        ImageGCDeps
	o        ImageGCOptions
	now      func() time.Time // o.Clock.Now
	changes  <-chan struct{}
	requests chan chan ImagePass // RunNow's requests, answered by Run
	nudges   chan string         // Nudge's triggers
	rethinks chan string         // Reconsider's triggers
	exec     *imageExecutor
	m        imageMetrics

	// Owned by the goroutine running passes.
	trig         imageTrigger
	learnedAt    time.Time
	learnOK      bool
	learned      []string            // from the runtime
	sandboxSeen  map[string]struct{} // images sandboxes were created from
	sandboxCache []string
	lastOutcome  string // outcome of the last pass (see passOutcome) when it removed nothing; "" otherwise
	// keepHeld says the last plan kept an image only because the fleet
	// keep list was never read (keep-list-unread): Reconsider passes then.
	keepHeld     bool
	diskFailures streak.Streak

	mu     sync.Mutex
	status ImageGCStatus
}

// NewImageGC returns an ImageGC subscribed to the projection; Run starts it.
// It registers its metrics on o.Registerer (which fails on a second one).
// It fails when a dependency is missing or the policy is invalid.
func NewImageGC(d ImageGCDeps, o ImageGCOptions) (*ImageGC, error) {
	switch {
	case d.Projection == nil || d.Runtime == nil || d.Disk == nil:
		return nil, errors.New("image gc: a projection, a runtime and a disk are required")
	case d.Deletes == nil && !o.DryRun:
		return nil, errors.New("image gc: deletes need a delete transaction (or DryRun)")
	}
	if err := o.Policy.Validate(); err != nil {
		return nil, err
	}
	if o.DiskInterval <= 0 {
		o.DiskInterval = DefaultDiskInterval
	}
	if o.Debounce <= 0 {
		o.Debounce = 20 * time.Millisecond
	}
	if o.Retry <= 0 {
		o.Retry = time.Minute
	}
	if o.RelearnInterval <= 0 {
		o.RelearnInterval = 5 * time.Minute
	}
	if o.RegretWindow <= 0 {
		o.RegretWindow = DefaultRegretWindow
	}
	if o.Clock == nil {
		o.Clock = clock.System(nil)
	}
	if d.Publisher == nil {
		d.Publisher = Discard{}
	}
	g := &ImageGC{d: d, o: o, now: o.Clock.Now, changes: d.Projection.Subscribe(), requests: make(chan chan ImagePass), nudges: make(chan string, 1), rethinks: make(chan string, 1), sandboxSeen: map[string]struct{}{}}
	g.trig = newImageTrigger(o)
	g.exec = &imageExecutor{
		rt: d.Runtime, disk: d.Disk, policy: o.Policy, dryRun: o.DryRun, now: o.Clock.Now,
		synced: d.Projection.Synced, deletes: d.Deletes, log: o.Log, fleetKeep: d.FleetKeep,
		users: func(ns, digest string) (ids []string) {
			d.Projection.ViewAll(func(states []*projection.State) {
				for _, s := range states {
					if s.Namespace != ns {
						continue
					}
					ids = s.DigestUsers(digest)
				}
			})
			return ids
		},
	}
	var err error
	if g.m, err = newImageMetrics(o.Registerer, o.Namespaces); err != nil {
		return nil, err
	}
	g.status = ImageGCStatus{DryRun: o.DryRun, High: o.Policy.HighThresholdPercent, Low: o.Policy.LowThresholdPercent,
		SandboxImages: slices.Clone(o.Policy.SandboxImages)}
	return g, nil
}

// Pass runs one pass now: plan against the projection and a fresh disk
// sample, then execute (or, in a dry run, only report). Run calls it; a tool
// may call it when Run is not running, never concurrently with Run.
func (g *ImageGC) Pass(ctx context.Context, trigger string) ImagePass {
	start := g.now()
	g.learn(ctx, start)
	gen := g.exec.generation() // before the measurement the plan trusts
	disk, derr := g.d.Disk.Disk()
	if derr != nil {
		disk = DiskStats{} // a failed measurement is none, whatever came with it
	}
	var plan ImagePlan
	var seq uint64
	synced := g.d.Projection.Synced()
	g.d.Projection.ViewAll(func(states []*projection.State) {
		g.observeSandboxes(states)
		plan = PlanImages(states, disk, g.policy(), start)
		seq = projection.SeqOf(states)
	})
	g.keepHeld = heldForKeepList(plan)
	if derr != nil {
		g.o.Log.Warn().Err(derr).Msg("image filesystem not measured: only max-age GC runs")
	}
	if g.d.Trace != nil {
		g.d.Trace.TracePolicy(start, g.Policy())
		if derr == nil {
			g.d.Trace.TraceDisk(start, disk, trigger)
		}
	}
	pass := ImagePass{Start: start, Trigger: trigger, DryRun: g.o.DryRun, Synced: synced, Disk: plan.Disk,
		Usage: plan.Usage, Triggered: plan.Triggered, AmountToFree: plan.AmountToFree, Planned: len(plan.Delete),
		Removed: []ImageOutcome{}, Skipped: []ImageOutcome{}, NextAgeOut: plan.NextAgeOut,
		Shortfall: plan.Shortfall(), FirstEligibleAt: plan.FirstEligibleAt}
	key := "image@" + strconv.FormatInt(start.UnixNano(), 10)
	log := g.o.Log.With().Str("pass", key).Logger()
	rep := &passReport{}
	started := passData(pass)
	rep.add(func(quiet bool) {
		log.WithLevel(level(zerolog.InfoLevel, quiet)).Str("trigger", trigger).Int("usage", plan.Usage).
			Int("high", g.o.Policy.HighThresholdPercent).Int("low", g.o.Policy.LowThresholdPercent).Bool("triggered", plan.Triggered).
			Int64("amount_to_free_bytes", plan.AmountToFree).Int("planned", len(plan.Delete)).Int64("estimated_bytes", plan.EstimatedBytes).
			Str("shortfall", pass.Shortfall).Bool("dry_run", g.o.DryRun).Msg("image gc pass started")
		if !quiet {
			g.publish(Action{Kind: "gc", Action: "started", Subject: "image", Key: key, Data: started}, log)
		}
	})
	for _, it := range plan.Keep {
		log.Debug().Str("namespace", it.Namespace).Str("image", firstName(it.Names)).Str("digest", it.Digest).Strs("names", it.Names).Int64("size_bytes", it.Size).
			Str("reason", string(it.Reason)).Str("rule", it.Rule).Msg("image kept")
	}

	g.exec.emit = func(o ImageOutcome) { g.handle(ctx, o, &pass, rep, log) }
	// A delete makes the pass news: its start goes out before the
	// removal's event, which the delete's transaction stores.
	g.exec.beforeDelete = func() { rep.flush(false) }
	res := g.exec.executeFrom(ctx, plan, gen)
	g.exec.emit, g.exec.beforeDelete = nil, nil

	pass.End = g.now()
	pass.EstimatedBytes, pass.FreedBytes = res.EstimatedBytes, res.FreedBytes
	pass.DiskAfter = res.Disk
	if !res.Measured {
		if d, err := g.d.Disk.Disk(); err == nil {
			pass.DiskAfter = d
		}
	}
	pass.UsageAfter, _ = usagePercent(pass.DiskAfter)
	pass.LowReached = lowReached(pass.DiskAfter, g.o.Policy.LowThresholdPercent)
	g.trig.passed(pass.End, seq, plan, pass)
	result, lvl := "completed", zerolog.InfoLevel
	if res.Err != nil {
		result, pass.Error, lvl = "failed", res.Err.Error(), zerolog.ErrorLevel
	}
	g.m.observePass(trigger, result, plan, pass)
	// A pass that removed nothing and found what the last one found says
	// nothing new: while the disk stays full it would repeat on every change.
	outcome := ""
	if len(pass.Removed) == 0 {
		outcome = passOutcome(plan, pass)
	}
	quiet := trigger != "manual" && outcome != "" && outcome == g.lastOutcome
	g.lastOutcome = outcome
	rep.add(func(quiet bool) {
		log.WithLevel(level(lvl, quiet)).Err(res.Err).Str("trigger", trigger).Int("removed", len(pass.Removed)).
			Int("skipped", len(pass.Skipped)).Int64("estimated_bytes", pass.EstimatedBytes).Int64("freed_bytes", pass.FreedBytes).
			Int("usage", pass.UsageAfter).Bool("low_reached", pass.LowReached).Float64("took_s", pass.End.Sub(pass.Start).Seconds()).
			Bool("unchanged", quiet).Msg("image gc pass " + result)
		if !quiet {
			g.publish(Action{Kind: "gc", Action: result, Subject: "image", Key: key, Data: passData(pass)}, log)
		}
	})
	rep.flush(quiet)
	g.mu.Lock()
	g.status.Passes++
	p := pass
	g.status.LastPass = &p
	g.status.NextAgeOut = plan.NextAgeOut
	g.mu.Unlock()
	return pass
}

// handle counts one outcome as it happens, and logs and publishes it
// through rep: a removal at once (with what rep held), a skip when the pass
// ends.
func (g *ImageGC) handle(ctx context.Context, o ImageOutcome, pass *ImagePass, rep *passReport, log zerolog.Logger) {
	key := imageRemovalKey(o.Namespace, o.Digest, o.FirstSeen)
	lvl := zerolog.InfoLevel
	if o.Action == ActionRemoved {
		pass.Removed = append(pass.Removed, o)
		g.recordRemoval(ctx, o, pass.Trigger, log)
		g.m.removed.WithLabelValues(o.Namespace, string(o.Rule)).Inc()
		g.m.bytes.WithLabelValues(o.Namespace, string(o.Rule), "estimated").Add(float64(o.Size))
		g.m.bytes.WithLabelValues(o.Namespace, string(o.Rule), "measured").Add(float64(max(o.Freed, 0)))
		if g.trig.reacted(o.At) {
			g.m.reaction.Observe(o.At.Sub(g.trig.crossedAt).Seconds())
		}
		rep.flush(false) // this pass is news: everything goes out as it happens
	} else {
		pass.Skipped = append(pass.Skipped, o)
		g.m.skipped.WithLabelValues(string(o.Reason)).Inc()
		// A skip recurs each pass; the pass start keeps its event distinct.
		key += "/" + strconv.FormatInt(pass.Start.UnixNano(), 10)
		if o.Reason == ReasonDeleteFailed {
			lvl = zerolog.WarnLevel
		}
	}
	rep.add(func(quiet bool) {
		ev := log.WithLevel(level(lvl, quiet))
		msg, reason, detail := "image "+o.Action, o.Reason, o.Detail
		switch {
		case o.Action == ActionRemoved:
			ev = ev.Str("via", o.Via).Bool("beyond_estimate", o.Beyond)
		case o.Reason == ReasonDryRun:
			// The fields of the removal it stands for, its reason too: grep
			// "remov" finds it. What a dry run cannot know, it says.
			msg, reason, detail = "would remove", o.Rule, dryRunEstimate
			ev = ev.Str("kind", "image").Bool("dry_run", true)
		}
		ev.Str("namespace", o.Namespace).Str("image", firstName(o.Names)).Str("digest", o.Digest).Strs("names", o.Names).Int64("size_bytes", o.Size).
			Int64("freed_bytes", o.Freed).Str("reason", string(reason)).Str("rule", string(o.Rule)).Str("detail", detail).
			Msg(msg)
		// A removal's event was stored by its delete transaction.
		if !quiet && o.Action != ActionRemoved {
			g.publish(Action{Kind: "image", Action: o.Action, Subject: o.Digest, Key: key, Data: imageData{ImageOutcome: o, DryRun: g.o.DryRun}}, log)
		}
	})
}

// dryRunEstimate is the detail of a dry run's would-remove line: a delete
// not made frees nothing to measure, so the dry run stops by the images'
// sizes where a run stops by the disk.
const dryRunEstimate = "estimated by the image's size: a run measures the disk after each delete and stops at the low threshold, " +
	"so it may remove fewer (a delete also frees the unpacked snapshot) or more (shared layers)"

// recordRemoval journals the removal in the projection, for regrets.
func (g *ImageGC) recordRemoval(ctx context.Context, o ImageOutcome, trigger string, log zerolog.Logger) {
	if g.d.Record == nil || g.o.DryRun {
		return
	}
	ev := events.ImageCollected{At: o.At, Digest: o.Digest, Names: o.Names, Size: o.Size, Freed: max(o.Freed, 0),
		Rule: string(o.Rule), Trigger: trigger, RegretUntil: o.At.Add(g.o.RegretWindow)}
	if err := g.d.Record(ctx, o.Namespace, ev); err != nil {
		log.Warn().Err(err).Str("digest", o.Digest).Msg("removal not recorded for regret telemetry")
	}
}

// policy is the configured policy plus the sandbox images learned so far,
// as a pass plans with it now (passPolicy: during a GC episode it plans down
// to the low threshold).
func (g *ImageGC) policy() ImagePolicy {
	p := g.o.Policy
	if len(g.sandboxCache) > 0 {
		p.SandboxImages = g.sandboxCache
	}
	if g.d.FleetKeep != nil {
		p.FleetKeep = g.d.FleetKeep()
	}
	return g.trig.passPolicy(p)
}

// Policy returns the policy passes use now: the configured one with the
// sandbox images learned from CRI and those sandbox containers were seen
// created from. It is safe for concurrent use and does not read the
// projection, so it may be called inside a View.
func (g *ImageGC) Policy() ImagePolicy {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.o.Policy
	p.SandboxImages = slices.Clone(g.status.SandboxImages)
	p.KeepPatterns = slices.Clone(p.KeepPatterns)
	if g.d.FleetKeep != nil {
		p.FleetKeep = g.d.FleetKeep()
		p.FleetKeep.Patterns = slices.Clone(p.FleetKeep.Patterns)
	}
	return p
}

// Status returns the current state; safe for concurrent use.
func (g *ImageGC) Status() ImageGCStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.status
	st.SandboxImages = slices.Clone(st.SandboxImages)
	if st.SandboxImages == nil {
		st.SandboxImages = []string{}
	}
	if st.LastPass != nil {
		p := *st.LastPass
		st.LastPass = &p
	}
	return st
}

// heldForKeepList reports whether plan keeps an image only because the
// fleet keep list was never read.
func heldForKeepList(plan ImagePlan) bool {
	return slices.ContainsFunc(plan.Keep, func(it ImageItem) bool { return it.Reason == ReasonKeepListUnread })
}
