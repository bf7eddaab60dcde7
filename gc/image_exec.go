package gc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/projection"
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
)

// Image outcome actions, as published.
const (
	ActionRemoved = "removed"
	ActionSkipped = "skipped"
)

// imageRuntime is what the image executor needs from the node: read the
// image and its users again right before a delete, and delete all its names.
type imageRuntime interface {
	// ImageNames returns every name pointing at the target digest now.
	ImageNames(ctx context.Context, digest string) ([]ImageName, error)
	// ImageUsers returns what holds the image now: containers whose image
	// is one of names, snapshots prepared from chain, CRI containers whose
	// image id is config.
	ImageUsers(ctx context.Context, names []string, config, chain string) ([]string, error)
	// RemoveImage deletes all names (of one digest), synchronously, and
	// says how (cri or native); errImageChanged when a name moved.
	RemoveImage(ctx context.Context, digest string, names []ImageName) (string, error)
	// LeasedContent returns the digests of the content that a lease (an
	// in-flight pull or import) holds now.
	LeasedContent(ctx context.Context) (map[string]bool, error)
}

// diskMeter measures the image filesystem.
type diskMeter interface {
	Disk() (DiskStats, error)
}

var (
	_ imageRuntime = Runtime{}
	_ diskMeter    = Statfs{}
)

// ImageOutcome is what a pass did with one image the plan named: removed,
// or skipped with the reason.
type ImageOutcome struct {
	Namespace string    `json:"namespace"`
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"`
	Size      int64     `json:"bytes"` // estimated: the image's size
	FirstSeen time.Time `json:"firstSeen"`
	LastUsed  time.Time `json:"lastUsed,omitzero"`
	// Rule is why the plan (or the measured disk) chose it: max-age or space.
	Rule   Reason `json:"rule"`
	Action string `json:"action"` // removed or skipped
	// Reason is Rule when removed, else why it was skipped.
	Reason Reason `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Freed is the measured growth of available bytes across the delete.
	Freed int64     `json:"freedBytes"`
	Via   string    `json:"via,omitempty"` // cri or native
	At    time.Time `json:"at"`
	// Beyond says the plan's estimate had said enough was freed before this
	// image, but the measured disk was still above the low threshold.
	Beyond bool `json:"beyondEstimate,omitempty"`
}

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
// names, measures the disk after each one and stops at the low threshold.
type imageExecutor struct {
	rt     imageRuntime
	disk   diskMeter
	users  func(ns, digest string) []string // the projection's users of digest in namespace ns now
	synced func() bool
	policy ImagePolicy
	dryRun bool
	now    func() time.Time
	// emit, if set, is called with each outcome as it happens (for logs,
	// metrics and events), before execute returns.
	emit func(ImageOutcome)
	// pub, when it is an Intender, records an intent before each delete; the
	// removal's Publish (through emit) completes it. log notes intent errors.
	pub Publisher
	log zerolog.Logger
}

// execute applies plan. Max-age images are all deleted; space images are
// deleted least recently used first until the measured disk is at or below
// the low threshold, going on past the plan's estimate when shared layers
// made it too optimistic. Without a measurement (dry run, statfs failing)
// the estimate decides. Per-image errors are joined into Err; the other
// images are still processed.
func (x *imageExecutor) execute(ctx context.Context, plan ImagePlan) imageExecResult {
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
	// Leases are read once per pass and namespace, on the first re-check
	// that needs them.
	leases := map[string]func() (map[string]bool, error){}
	var errs []error
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
		}
		// Each image is re-read and deleted in its own namespace.
		ctx := inNamespace(ctx, it.Namespace)
		leased, ok := leases[it.Namespace]
		if !ok {
			leased = sync.OnceValues(func() (map[string]bool, error) { return x.rt.LeasedContent(ctx) })
			leases[it.Namespace] = leased
		}
		names, why, detail, err := x.recheck(ctx, it, leased)
		if err != nil {
			errs = append(errs, fmt.Errorf("re-check image %s: %w", it.Digest, err))
			skip(ReasonDeleteFailed, err.Error())
			continue
		}
		if why != "" {
			skip(why, detail)
			continue
		}
		if x.dryRun {
			estimated += it.Size
			skip(ReasonDryRun, "would remove ("+string(rule)+")")
			continue
		}
		// Intent before action: a crash after the delete still gets its event.
		intent := Action{Kind: "image", Action: ActionRemoved, Subject: it.Digest, Key: imageRemovalKey(it.Namespace, it.Digest, it.FirstSeen),
			Data: imageData{ImageOutcome: x.outcome(it, rule, ActionRemoved, rule, "")}}
		intended := intendDelete(x.pub, intent, x.log)
		via, err := x.rt.RemoveImage(ctx, it.Digest, names)
		if err != nil {
			abandonDelete(x.pub, intent, intended, x.log)
		}
		if errors.Is(err, errImageChanged) {
			skip(ReasonChanged, err.Error())
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove image %s %v: %w", it.Digest, it.Names, err))
			skip(ReasonDeleteFailed, err.Error())
			continue
		}
		o := x.outcome(it, rule, ActionRemoved, rule, "")
		o.Via, o.Beyond = via, beyond
		if res.FirstDelete.IsZero() {
			res.FirstDelete = o.At
		}
		if d, err := x.disk.Disk(); err == nil && res.Measured {
			o.Freed = int64(d.AvailableBytes) - int64(res.Disk.AvailableBytes)
			res.Disk = d
		} else {
			res.Measured = false
		}
		estimated += it.Size
		res.Removed++
		res.EstimatedBytes += it.Size
		res.FreedBytes += o.Freed
		res.add(x, o)
	}
	res.Err = errors.Join(errs...)
	return res
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

// recheck reads the image from containerd, its users from containerd and
// the projection, and whether a lease holds its target (leased, read once
// per pass), right before the delete. It returns the names to delete, or
// why not to; an error when it cannot tell.
func (x *imageExecutor) recheck(ctx context.Context, it ImageItem, leased func() (map[string]bool, error)) ([]ImageName, Reason, string, error) {
	names, err := x.rt.ImageNames(ctx, it.Digest)
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
	if users := x.users(it.Namespace, it.Digest); len(users) > 0 {
		return nil, ReasonInUse, "projection users: " + strings.Join(users, ","), nil
	}
	users, err := x.rt.ImageUsers(ctx, now, it.ConfigDigest, it.ChainID)
	if err != nil {
		return nil, "", "", err
	}
	if len(users) > 0 {
		return nil, ReasonInUse, "containerd users: " + strings.Join(users, ","), nil
	}
	// A pull of a name whose target is this image writes under a lease and
	// creates its record early (native pulls before unpacking).
	held, err := leased()
	if err != nil {
		return nil, "", "", err
	}
	if held[it.Digest] {
		return nil, ReasonInFlightPull, "a lease holds " + it.Digest, nil
	}
	return names, "", "", nil
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
