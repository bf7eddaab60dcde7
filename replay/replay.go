// Package replay simulates image GC over a node's usage trace (package
// trace): given the records and a policy, it answers what that policy
// would have deleted, what would have come back (re-pulls, and their
// bytes), how long the disk would have stayed above the high threshold
// and how full it would have been, side by side with what really
// happened. It reuses the agent's own planner (gc.PlanImages) and
// projection (projection.State), so replaying the policy that ran
// reproduces the agent's deletions.
//
// Simulate is a pure function of the trace, the policy and the deletion
// order; the command (Command) reads a trace and prints.
package replay

import (
	"cmp"
	"slices"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// Orders of threshold GC the replay knows (Options.Order).
const (
	OrderLRU  = "lru"  // least recently used first: the kubelet's, the agent's
	OrderGDSF = "gdsf" // Greedy-Dual-Size-Frequency, a re-pull priced in time (PullCost): see gdsf
	// OrderGDSFBytes is GDSF with a re-pull priced in its bytes: over a
	// footprint in proportion to them, frequency with aging.
	OrderGDSFBytes = "gdsf-bytes"
)

// Options say what to replay.
type Options struct {
	// Policy returns the policy in force given the one the trace recorded
	// then (nil before the trace recorded any): the flags given to the
	// replay change the recorded one. Nil replays the recorded policy
	// (the kubelet's defaults before one is recorded).
	Policy func(recorded *trace.Policy) gc.ImagePolicy
	// Order is the deletion order of threshold GC: OrderLRU (default),
	// OrderGDSF or OrderGDSFBytes.
	Order string
	// PullCost prices a re-pull in time, for Outcome.RepullTime and
	// OrderGDSF's cost; zero is DefaultPullCost.
	PullCost PullCost
	// Detail keeps each deletion of both sides in the Result.
	Detail bool
}

// Result is a replay next to what the trace recorded.
type Result struct {
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	Records  int       `json:"records"`
	Images   int       `json:"images"` // distinct images (namespace and digest) the trace holds
	Capacity uint64    `json:"capacityBytes"`
	// Policy is the policy replayed, as it was in force at the end;
	// RecordedPolicy the one the trace recorded last (nil: none).
	Policy         trace.Policy  `json:"policy"`
	RecordedPolicy *trace.Policy `json:"recordedPolicy,omitempty"`
	// DryRun is how long of the trace the agent ran as a dry run,
	// deleting nothing: the replay deletes there as its policy says, so
	// the sides differ even with the recorded policy.
	DryRun time.Duration `json:"dryRunNs,omitempty"`
	// Recorded is what happened, Replayed what the policy would have done.
	Recorded Outcome `json:"recorded"`
	Replayed Outcome `json:"replayed"`
	// FootprintRatio is the bytes an image's delete freed on the
	// filesystem per byte of its size, over the deletions the trace
	// measured (1 when none): what an image never deleted is taken to
	// occupy (see footprints).
	FootprintRatio float64 `json:"footprintRatio"`
	// PullCost is how re-pulls were priced in time (Outcome.RepullTime).
	PullCost PullCost `json:"pullCost"`
}

// Outcome is one side of a Result.
type Outcome struct {
	Deletions    int   `json:"deletions"`
	DeletedBytes int64 `json:"deletedBytes"`
	// Repulls are images needed again (pulled, or a container created
	// from them) after this side's image GC deleted them.
	Repulls       int   `json:"repulls"`
	RepulledBytes int64 `json:"repulledBytes"`
	// RepullTime is what the re-pulls cost in time, estimated
	// (Options.PullCost): the node's pods waited that long in all.
	RepullTime time.Duration `json:"repullTimeNs"`
	// MedianReturn is the median time from a deletion to its re-pull.
	MedianReturn time.Duration `json:"medianReturnNs"`
	// AboveHigh is the time the disk spent at or above the high threshold.
	AboveHigh time.Duration `json:"aboveHighNs"`
	// PeakUsage is the highest usage reached, in percent (the kubelet's
	// rounding), and MeanFree the free share of the disk averaged over
	// time, in percent: the headroom the policy kept.
	PeakUsage int     `json:"peakUsagePercent"`
	MeanFree  float64 `json:"meanFreePercent"`
	// Passes are the image GC passes that deleted something.
	Passes int `json:"passes"`
	// Deleted lists each deletion in order (Options.Detail).
	Deleted []Deletion `json:"deleted,omitempty"`
}

// Deletion is one image deleted by image GC.
type Deletion struct {
	T         time.Time `json:"t"`
	Namespace string    `json:"ns"`
	Digest    string    `json:"digest"`
	Names     []string  `json:"names,omitempty"`
	Size      int64     `json:"size"`
	Rule      string    `json:"rule"`
	Trigger   string    `json:"trigger,omitempty"`
	// Returned is when the image was needed again; zero if it was not.
	Returned time.Time `json:"returned,omitzero"`
}

// Simulate replays image GC over recs, a canonical trace (trace.Load,
// or trace.Decode then trace.Canonical). It does no I/O.
func Simulate(recs []trace.Record, o Options) Result {
	s := newSim(recs, o)
	for _, r := range recs {
		s.record(r)
	}
	return s.finish()
}

// PolicyOf is a recorded policy as the planner takes it.
func PolicyOf(p trace.Policy) gc.ImagePolicy {
	return gc.ImagePolicy{HighThresholdPercent: p.High, LowThresholdPercent: p.Low, MinAge: time.Duration(p.MinAge),
		MaxAge: time.Duration(p.MaxAge), SandboxImages: slices.Clone(p.SandboxImages), KeepPatterns: slices.Clone(p.KeepPatterns),
		// The patterns a pass planned with: a list known then (a wait for
		// one never read is not recorded, and a replay does not wait).
		FleetKeep: gc.KeepList{Input: gc.Input{State: gc.InputKnown}, Patterns: slices.Clone(p.FleetKeepPatterns)}}
}

// TraceOf is p as a trace records it, with order.
func TraceOf(p gc.ImagePolicy, order string) trace.Policy {
	return trace.Policy{High: p.HighThresholdPercent, Low: p.LowThresholdPercent, MinAge: trace.Duration(p.MinAge),
		MaxAge: trace.Duration(p.MaxAge), SandboxImages: slices.Clone(p.SandboxImages), KeepPatterns: slices.Clone(p.KeepPatterns),
		FleetKeepPatterns: slices.Clone(p.FleetKeep.Patterns), Order: order}
}

// DefaultPolicy is the kubelet's image GC policy (and the agent's
// defaults): 85%, 80%, 2m, no maximum age.
func DefaultPolicy() gc.ImagePolicy {
	return gc.ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute}
}

// median returns the median of ds (0 for none); ds is sorted in place.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.SortFunc(ds, func(a, b time.Duration) int { return cmp.Compare(a, b) })
	if n := len(ds); n%2 == 0 {
		return (ds[n/2-1] + ds[n/2]) / 2
	}
	return ds[len(ds)/2]
}
