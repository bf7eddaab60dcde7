package gc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
)

// Why the image executor did not delete an image the plan named.
const (
	ReasonChanged      Reason = "changed"               // its names or targets changed since the plan
	ReasonGone         Reason = "gone"                  // no name is left: deleted by someone else
	ReasonDryRun       Reason = "dry-run"               // --dry-run: nothing is deleted
	ReasonLowReached   Reason = "low-threshold-reached" // the disk is at or below the low threshold
	ReasonNotSynced    Reason = "not-synced"            // the projection has not seen a full listing yet
	ReasonDeleteFailed Reason = "error"                 // the delete failed; see Detail
	ReasonCanceled     Reason = "canceled"              // the agent is stopping
	ReasonInFlightPull Reason = "in-flight-pull"        // a containerd lease holds its target: a pull or import is writing it
	ReasonUnsettled    Reason = "unsettled"             // an earlier delete's outcome is not known yet: nothing goes until containerd says
)

// Image outcome actions, as published.
const (
	ActionRemoved = "removed"
	ActionSkipped = "skipped"
)

// diskMeter measures the image filesystem.
type diskMeter interface {
	Disk() (DiskStats, error)
}

// ImageOutcome is schema.ImageOutcome (the payload lives in package schema).
type ImageOutcome = schema.ImageOutcome

// imageExecResult is what one execution of a plan did.
type imageExecResult struct {
	Outcomes       []ImageOutcome
	Removed        int
	EstimatedBytes int64 // sum of the sizes of the removed images
	FreedBytes     int64 // measured: available bytes after minus before
	Disk           DiskStats
	Measured       bool // Disk is a statfs sample taken after the last delete
	FirstDelete    time.Time
	Err            error // per-image errors, joined
}

// imageExecutor applies image plans: it re-checks each image against
// containerd and the projection right before deleting it, deletes all its
// names inside a delete transaction, measures the disk after each one and
// stops at the low threshold.
type imageExecutor struct {
	rt     imageNode
	disk   diskMeter
	users  func(ns, digest string) []string // the projection's users of digest in namespace ns now
	synced func() bool
	// fleetKeep, if set, is the fleet keep list now: it changes while a
	// pass runs, and an image it names since the plan is kept.
	fleetKeep func() KeepList
	policy    ImagePolicy
	dryRun    bool
	now       func() time.Time
	// emit, if set, is called with each outcome as it happens (for logs,
	// metrics and the events of skips), before execute returns.
	emit func(ImageOutcome)
	// deletes begins each delete's transaction; its commit stores the
	// removal's event. beforeDelete, if set, runs right before each
	// delete call (the pass's report goes out before the removal).
	deletes      deleteLog
	beforeDelete func()
	log          zerolog.Logger
}

// execute applies plan. Max-age images are all deleted; space images are
// deleted least recently used first until the measured disk is at or below
// the low threshold, going on past the plan's estimate when shared layers
// made it too optimistic. Without a measurement (dry run, statfs failing)
// the estimate decides, and nothing goes past the plan. A delete whose
// outcome containerd cannot tell ends the pass: nothing more is deleted
// until it is settled and the disk measured again (the next pass). Per-image
// errors are joined into Err; the other images are still processed.
func (x *imageExecutor) execute(ctx context.Context, plan ImagePlan) imageExecResult {
	return x.executeFrom(ctx, plan, x.generation())
}

// generation is the count of settled unknown deletes now (0 without
// deletes).
func (x *imageExecutor) generation() uint64 {
	if x.deletes == nil {
		return 0
	}
	return x.deletes.Generation()
}

// executeFrom is execute for a plan whose disk was measured when gen
// deletes with an unknown outcome had been settled: once more are, the
// measurement is stale and nothing more is deleted.
func (x *imageExecutor) executeFrom(ctx context.Context, plan ImagePlan, gen uint64) imageExecResult {
	res := imageExecResult{Disk: plan.Disk, Measured: !plan.InvalidCapacity}
	queue := slices.Clone(plan.Delete)
	planned := len(queue)
	if plan.Triggered && !x.dryRun {
		for _, it := range plan.Keep {
			if it.Reason == ReasonNotNeeded {
				queue = append(queue, it)
			}
		}
	}
	synced := x.synced()
	var errs []error
	unsettled := "" // why the pass stopped deleting: an unknown outcome
	if x.deletes != nil && x.deletes.Unsettled() > 0 {
		// containerd has not said what became of an earlier delete: ask it
		// nothing more for this pass (it may hang), delete nothing.
		unsettled = deletion.ErrUnsettled.Error()
	}
	estimated := int64(0) // bytes the plan's estimate counts as freed so far
	for i, it := range queue {
		beyond := i >= planned
		rule := it.Reason
		if beyond {
			rule = ReasonSpace
		}
		skip := func(r Reason, detail string) {
			if beyond {
				return // never planned: nothing to report
			}
			res.add(x, x.outcome(it, rule, ActionSkipped, r, detail))
		}
		if beyond && !res.Measured {
			break // past the plan only on a fresh measurement
		}
		if rule == ReasonSpace && x.enough(plan, res, estimated) {
			skip(ReasonLowReached, "")
			continue
		}
		switch {
		case ctx.Err() != nil:
			skip(ReasonCanceled, "")
			continue
		case !synced:
			skip(ReasonNotSynced, "")
			continue
		case unsettled != "":
			skip(ReasonUnsettled, unsettled)
			continue
		}
		names, why, detail, err := x.recheck(ctx, it)
		if err != nil {
			errs = append(errs, fmt.Errorf("re-check image %s: %w", it.Digest, err))
			skip(ReasonDeleteFailed, err.Error())
			continue
		}
		if why != "" {
			skip(why, detail)
			continue
		}
		if x.dryRun || x.deletes == nil {
			estimated += it.Size
			skip(ReasonDryRun, string(rule))
			continue
		}
		o, afterError, err := x.remove(ctx, it, names, rule, gen, &res)
		var kept skipped
		switch {
		case errors.As(err, &kept):
			skip(kept.reason, kept.detail)
			continue
		case errors.Is(err, deletion.ErrUnsettled):
			unsettled = err.Error()
			errs = append(errs, err)
			skip(ReasonUnsettled, unsettled)
			continue
		case errors.Is(err, ErrImageChanged):
			skip(ReasonChanged, err.Error())
			continue
		case errors.Is(err, ErrOwnerWon):
			skip(ReasonGone, "deleted by someone else")
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("remove image %s %v: %w", it.Digest, it.Names, err))
			skip(ReasonDeleteFailed, err.Error())
			continue
		}
		o.Beyond = beyond
		estimated += it.Size
		res.Removed++
		res.EstimatedBytes += it.Size
		res.FreedBytes += o.Freed
		res.add(x, o)
		if afterError {
			// A delete that timed out may still be freeing space in
			// containerd's GC: the measurement after it is not yet the
			// truth. Nothing more goes in this pass; the next one
			// measures again.
			unsettled = "a delete reported an error before it completed; the disk is measured again next pass"
			res.Measured = false
		}
	}
	res.Err = errors.Join(errs...)
	return res
}

// skipped is a reason not to delete found inside remove (after the
// intent was recorded): the transaction was aborted.
type skipped struct {
	reason Reason
	detail string
}

func (s skipped) Error() string { return string(s.reason) + ": " + s.detail }

// remove deletes image it (its names now are names) in a delete
// transaction: it records the intent, asks the node what holds the image
// right then, deletes, and measures the disk after it. It returns the
// removal's outcome, whose event its commit stored, and whether the
// delete call failed although it happened (afterError); skipped when the
// node says something holds it; ErrImageChanged or ErrOwnerWon when
// nothing of ours was deleted; an error wrapping deletion.ErrUnsettled
// when the delete's outcome is not known (the pass must stop deleting);
// any other error when it did not happen.
func (x *imageExecutor) remove(ctx context.Context, it ImageItem, names []ImageName, rule Reason, gen uint64, res *imageExecResult) (o ImageOutcome, afterError bool, err error) {
	o = x.outcome(it, rule, ActionRemoved, rule, "")
	tx, err := x.deletes.Begin(ctx, it.Namespace, Action{Kind: "image", Action: ActionRemoved, Subject: it.Digest,
		Key: imageRemovalKey(it.Namespace, it.Digest, it.FirstSeen), Data: imageData{ImageOutcome: o}}, imageIdentity(names))
	if err != nil {
		return o, false, err
	}
	if x.deletes.Generation() != gen {
		// Begin settled a delete whose outcome was unknown: the disk the
		// plan measured may be stale. The next pass measures again.
		_ = tx.Abort()
		res.Measured = false
		return o, false, fmt.Errorf("%w: a delete settled since the disk was measured", deletion.ErrUnsettled)
	}
	// The node's answer is read after the intent is durable, right before
	// the call: the window left for a new user is one round trip.
	if why, detail, err := x.holders(ctx, it, names); err != nil || why != "" {
		_ = tx.Abort()
		if err != nil {
			return o, false, err
		}
		return o, false, skipped{why, detail}
	}
	if x.beforeDelete != nil {
		x.beforeDelete()
	}
	via, err := x.rt.RemoveImage(tx.Call(ctx), it.Namespace, it.Digest, names) // ends with the agent lock's hold
	if errors.Is(err, ErrOwnerWon) {
		_ = tx.Abort()
		return o, false, err
	}
	if err != nil {
		// Did containerd commit the delete (also when a name moved after
		// others were deleted)? Ask before anything else goes.
		switch out, serr := tx.Settle(ctx); out {
		case deletion.NotHappened:
			return o, false, err
		case deletion.Unknown:
			res.Measured = false
			return o, false, fmt.Errorf("%w: image %s: %w (after: %w)", deletion.ErrUnsettled, it.Digest, serr, err)
		}
		o.Detail, afterError = "the delete reported an error but happened: "+err.Error(), true
	}
	o.Via, o.At = via, x.now()
	if res.FirstDelete.IsZero() {
		res.FirstDelete = o.At
	}
	if d, err := x.disk.Disk(); err == nil && res.Measured {
		o.Freed = int64(d.AvailableBytes) - int64(res.Disk.AvailableBytes)
		res.Disk = d
	} else {
		res.Measured = false
	}
	if err := tx.Commit(imageData{ImageOutcome: o}); err != nil {
		x.log.Warn().Err(err).Str("digest", it.Digest).Msg("store the removal's event")
	}
	return o, afterError, nil
}

// imageIdentity is what the delete of names is about: each name with its
// record's creation time, as the re-check read them.
func imageIdentity(names []ImageName) *deletion.Identity {
	id := &deletion.Identity{Names: make([]deletion.Name, len(names))}
	for i, n := range names {
		id.Names[i] = deletion.Name{Name: n.Name, Created: n.Created}
	}
	return id
}

func (res *imageExecResult) add(x *imageExecutor, o ImageOutcome) {
	res.Outcomes = append(res.Outcomes, o)
	if x.emit != nil {
		x.emit(o)
	}
}

// enough reports whether threshold GC has freed what it must: measured
// available bytes at or above the low threshold's, or, without a
// measurement, the estimate reaching the plan's amount to free.
func (x *imageExecutor) enough(plan ImagePlan, res imageExecResult, estimated int64) bool {
	if !res.Measured || x.dryRun {
		return estimated >= plan.AmountToFree
	}
	return lowReached(res.Disk, x.policy.LowThresholdPercent)
}

// lowReached reports whether usage is at or below low percent, in the
// kubelet's arithmetic: available at least capacity*(100-low)/100.
func lowReached(d DiskStats, low int) bool {
	return d.CapacityBytes > 0 && min(d.AvailableBytes, d.CapacityBytes) >= mulDiv(d.CapacityBytes, uint64(100-low), 100)
}

// usagePercent is the kubelet's usage: 100 - available*100/capacity,
// rounded up; ok is false for a zero capacity.
func usagePercent(d DiskStats) (int, bool) {
	if d.CapacityBytes == 0 {
		return 0, false
	}
	return 100 - int(mulDiv(min(d.AvailableBytes, d.CapacityBytes), 100, d.CapacityBytes)), true
}

// recheck reads the image's names from containerd and its users from the
// projection before the delete's intent is recorded (what the node says
// holds it is asked after, by holders). It returns the names to delete, or
// why not to; an error when it cannot tell.
func (x *imageExecutor) recheck(ctx context.Context, it ImageItem) ([]ImageName, Reason, string, error) {
	names, err := x.rt.ImageNames(ctx, it.Namespace, it.Digest)
	if err != nil {
		return nil, "", "", err
	}
	if len(names) == 0 {
		return nil, ReasonGone, "", nil
	}
	now := make([]string, len(names))
	for i, n := range names {
		now[i] = n.Name
		if n.Labels[projection.LabelPinned] == projection.LabelPinnedValue {
			return nil, ReasonPinned, "pinned since the plan: " + n.Name, nil
		}
	}
	if !slices.Equal(now, it.Names) {
		return nil, ReasonChanged, namesDiff(it.Names, now), nil
	}
	if x.fleetKeep != nil {
		kl := x.fleetKeep()
		for _, pattern := range kl.Patterns {
			for _, n := range now {
				if ValidKeepPattern(pattern) == nil && keepMatch(pattern, n) {
					return nil, ReasonKeepPattern, "fleet keep list since the plan: " + pattern, nil
				}
			}
		}
		for _, n := range now {
			for _, prefix := range kl.Prefixes {
				if PrefixKeeps(prefix, n) {
					return nil, ReasonKeepPattern, "fleet keep list since the plan: " + prefix + "... (an invalid pattern)", nil
				}
			}
			if ref, by, ok := DeclaredMatch(kl.Declared, n); ok {
				return nil, ReasonKeepPattern, DeclaredRule(ref, by) + " since the plan", nil
			}
		}
	}
	if users := x.users(it.Namespace, it.Digest); len(users) > 0 {
		return nil, ReasonInUse, "projection users: " + strings.Join(users, ","), nil
	}
	return names, "", "", nil
}

// holders asks the node what holds it now: the one answer to "is this
// image in use?" (containers, snapshots, CRI, leases). It returns why not
// to delete, or "".
func (x *imageExecutor) holders(ctx context.Context, it ImageItem, names []ImageName) (Reason, string, error) {
	now := make([]string, len(names))
	for i, n := range names {
		now[i] = n.Name
	}
	holders, err := x.rt.ImageHolders(ctx, it.Namespace, ImageRef{Digest: it.Digest, Names: now, Config: it.ConfigDigest, Chain: it.ChainID})
	if err != nil {
		return "", "", fmt.Errorf("re-check image %s: %w", it.Digest, err)
	}
	if len(holders) == 0 {
		return "", "", nil
	}
	ids := make([]string, len(holders))
	for i, h := range holders {
		ids[i] = h.Kind + ":" + h.ID
	}
	// A pull of a name whose target is this image writes under a lease and
	// creates its record early (native pulls before unpacking).
	if !slices.ContainsFunc(holders, func(h Holder) bool { return h.Kind != HolderLease }) {
		return ReasonInFlightPull, "a lease holds " + it.Digest + ": " + strings.Join(ids, ","), nil
	}
	return ReasonInUse, "containerd users: " + strings.Join(ids, ","), nil
}

func namesDiff(was, now []string) string {
	in := map[string]bool{}
	for _, n := range now {
		in[n] = true
	}
	var parts []string
	for _, n := range was {
		if !in[n] {
			parts = append(parts, "-"+n)
		}
		delete(in, n)
	}
	for _, n := range slices.Sorted(maps.Keys(in)) {
		parts = append(parts, "+"+n)
	}
	return "names changed: " + strings.Join(parts, " ")
}

func (x *imageExecutor) outcome(it ImageItem, rule Reason, action string, reason Reason, detail string) ImageOutcome {
	return ImageOutcome{
		Namespace: it.Namespace, Digest: it.Digest, Names: it.Names, Size: it.Size, FirstSeen: it.FirstSeen, LastUsed: it.LastUsed,
		Rule: rule, Action: action, Reason: reason, Detail: detail, At: x.now(),
	}
}
