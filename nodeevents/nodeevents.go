// Package nodeevents turns what the agents publish into the Kubernetes
// Events a user reads on the Node (`kubectl describe node`, `kubectl get
// events`): one per removal, per image GC pass that freed space or could
// not free enough, per failure, per regret and per lost state, with the
// kubelet's reasons where the kubelet has them (FreeDiskSpaceFailed,
// ImageGCFailed). It is pure: the cluster component reads the agents'
// CloudEvents from NATS, aggregates what this package makes of them with
// client-go's event correlator and writes them to the API server. Nodes
// publish nothing new for it.
package nodeevents

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/gcagent/gcagent/fleet"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

// Event is what one agent action becomes on its Node.
type Event struct {
	// Node is the Node's name: the agent's --node-name, from the
	// CloudEvent's source.
	Node string
	// Type is Normal or Warning.
	Type string
	// Reason is the event's reason (the Reason* constants), Action what the
	// agent did (events.k8s.io/v1 action).
	Reason, Action string
	// Note is the message, one line.
	Note string
	// Time is when the agent did it.
	Time time.Time
}

// The event types.
const (
	Normal  = "Normal"
	Warning = "Warning"
)

// The reasons. FreeDiskSpaceFailed and ImageGCFailed are the kubelet's own
// (its image GC's), with the same meaning; the others are new.
const (
	ReasonImageRemoved     = "ImageRemoved"
	ReasonContainerRemoved = "ContainerRemoved"
	ReasonLogRemoved       = "LogRemoved"
	// ReasonImageGCCompleted: a pass removed images (how many, what it
	// freed, the usage after).
	ReasonImageGCCompleted = "ImageGCCompleted"
	// ReasonFreeDiskSpaceFailed: a pass could not free what the threshold
	// asked for (the kubelet's reason, for the same outcome).
	ReasonFreeDiskSpaceFailed = "FreeDiskSpaceFailed"
	// ReasonImageGCFailed: a pass failed (the kubelet's reason).
	ReasonImageGCFailed = "ImageGCFailed"
	// ReasonImageRegretted: an image GC removed came back on the node soon
	// after (a re-pull).
	ReasonImageRegretted = "ImageRegretted"
	// ReasonGCStateReset: the agent's state could not be read and was
	// rebuilt; its LRU history is lost.
	ReasonGCStateReset = "GCStateReset"
)

// Reasons are every reason Map gives, for metrics' labels.
var Reasons = []string{ReasonImageRemoved, ReasonContainerRemoved, ReasonLogRemoved, ReasonImageGCCompleted,
	ReasonFreeDiskSpaceFailed, ReasonImageGCFailed, ReasonImageRegretted, ReasonGCStateReset}

// The actions (events.k8s.io/v1 action).
const (
	ActionRemoveImage     = "RemoveImage"
	ActionRemoveContainer = "RemoveContainer"
	ActionRemoveLog       = "RemoveLog"
	ActionGarbageCollect  = "GarbageCollect"
	ActionPullAgain       = "ImagePulledAgain"
	ActionRebuildState    = "RebuildState"
)

// ActionOf is the action of the events with reason (Map's pairing), ""
// for a reason Map never gives.
func ActionOf(reason string) string {
	switch reason {
	case ReasonImageRemoved:
		return ActionRemoveImage
	case ReasonContainerRemoved:
		return ActionRemoveContainer
	case ReasonLogRemoved:
		return ActionRemoveLog
	case ReasonImageGCCompleted, ReasonFreeDiskSpaceFailed, ReasonImageGCFailed:
		return ActionGarbageCollect
	case ReasonImageRegretted:
		return ActionPullAgain
	case ReasonGCStateReset:
		return ActionRebuildState
	}
	return ""
}

// Map returns the Event an agent's CloudEvent becomes, and false for one
// that is shown as no Event: a skip, a dry run's would-be removal, a pass
// that neither removed nor fell short, a heartbeat, a start. An event of
// a shown type whose data does not decode is an error (counted and
// skipped by the caller).
func Map(ev natsbus.CloudEvent) (Event, bool, error) {
	_, node := fleet.SplitSource(ev.Source)
	if node == "" || !strings.HasPrefix(ev.Source, "gcagent/") {
		return Event{}, false, fmt.Errorf("event %s: source %q is not gcagent/<cluster>/<node>", ev.ID, ev.Source)
	}
	kind, action := fleet.SplitType(ev.Type)
	switch {
	case action == schema.ActionRemoved && (kind == schema.KindImage || kind == schema.KindContainer || kind == schema.KindLog),
		kind == schema.KindImage && action == schema.ActionRegretted,
		kind == schema.KindGC && (action == "completed" || action == "failed"),
		kind == schema.KindAgent && action == "state_reset":
	default:
		return Event{}, false, nil
	}
	data, err := fleet.Decode(ev)
	if err != nil {
		return Event{}, false, err
	}
	e := Event{Node: node, Type: Normal, Time: ev.Time}
	switch d := data.(type) {
	case *fleet.ImageEvent:
		if d.DryRun {
			return Event{}, false, nil
		}
		e.Reason, e.Action = ReasonImageRemoved, ActionRemoveImage
		e.Note = fmt.Sprintf("Removed image %s: %s (%s)", fleet.ImageLabel(d.Namespace, d.Names, cmp.Or(d.Digest, ev.Subject)),
			freed(d.Freed, d.Size), rule(d.Rule, d.LastUsed, ev.Time))
	case *fleet.ContainerEvent:
		if d.DryRun {
			return Event{}, false, nil
		}
		e.Reason, e.Action = ReasonContainerRemoved, ActionRemoveContainer
		e.Note = fmt.Sprintf("Removed dead container %s (%s)", fleet.ContainerLabel(d.Namespace, ev.Subject, d.PodNamespace, d.PodName, d.ContainerName), d.Reason)
		if d.Logs != nil && len(d.Logs.Files) > 0 {
			e.Note += fmt.Sprintf(" and its %d log files (%s)", len(d.Logs.Files), human(d.Logs.Bytes))
		}
	case *fleet.LogEvent:
		if d.DryRun {
			return Event{}, false, nil
		}
		e.Reason, e.Action = ReasonLogRemoved, ActionRemoveLog
		what := "dangling log link"
		if d.Kind == "poddir" {
			what = "orphaned pod log dir"
		}
		e.Note = fmt.Sprintf("Removed %s %s/%s (%s, %s)", what, strings.TrimRight(d.Dir, "/"), d.Name, d.Reason, human(d.Bytes))
		if d.Partial {
			e.Type, e.Note = Warning, e.Note+": partly, "+d.Error
		}
	case *fleet.GCEvent:
		if d.DryRun {
			return Event{}, false, nil
		}
		e.Action = ActionGarbageCollect
		switch {
		case action == "failed":
			e.Type, e.Reason = Warning, ReasonImageGCFailed
			e.Note = fmt.Sprintf("Image garbage collection failed (%s, disk %d%%): %s", d.Trigger, d.Usage, cmp.Or(d.Error, "unknown error"))
		case d.Shortfall != "" && d.AmountToFree > 0:
			// The kubelet's own words for the same outcome, then ours.
			e.Type, e.Reason = Warning, ReasonFreeDiskSpaceFailed
			e.Note = fmt.Sprintf("Failed to garbage collect required amount of images. Attempted to free %d bytes, but only found %d bytes eligible to free. Removed %d images, %s; disk %d%% → %d%%: %s",
				d.AmountToFree, d.EstimatedBytes, d.Removed, freed(d.FreedBytes, d.EstimatedBytes), d.Usage, d.UsageAfter, d.Shortfall)
		case d.Removed > 0:
			e.Reason = ReasonImageGCCompleted
			e.Note = fmt.Sprintf("Image garbage collection (%s): removed %d images, %s; disk %d%% → %d%%", d.Trigger, d.Removed,
				freed(d.FreedBytes, d.EstimatedBytes), d.Usage, d.UsageAfter)
		default:
			return Event{}, false, nil
		}
	case *fleet.RegretEvent:
		e.Type, e.Reason, e.Action = Warning, ReasonImageRegretted, ActionPullAgain
		e.Note = fmt.Sprintf("Image %s came back %s after gcagent removed it (%s, trigger %s): a re-pull of %s",
			fleet.ImageLabel(d.Namespace, d.Names, d.Digest), (time.Duration(d.ReturnAfterSeconds) * time.Second).String(), d.Rule, d.Trigger, human(d.Bytes))
	case *fleet.StateReset:
		e.Type, e.Reason, e.Action = Warning, ReasonGCStateReset, ActionRebuildState
		e.Note = "gcagent's state could not be read and was rebuilt from containerd: the images' LRU history is lost"
		if d.Error != "" {
			e.Note += " (" + d.Error + ")"
		}
	default:
		return Event{}, false, nil
	}
	return e, true, nil
}

// freed says what a removal freed: measured when the disk said, else the
// estimate, said as one.
func freed(measured, estimated int64) string {
	if measured > 0 {
		return human(measured) + " freed"
	}
	return human(estimated) + " estimated (the disk did not say)"
}

func rule(r schema.Reason, lastUsed, at time.Time) string {
	switch {
	case r == "" && lastUsed.IsZero():
		return "unused"
	case lastUsed.IsZero():
		return string(r) + ", never used"
	}
	return fmt.Sprintf("%s, unused for %s", r, at.Sub(lastUsed).Round(time.Second))
}

// human is a byte count as an operator reads it (gc's binary units).
func human(n int64) string { return gc.HumanBytes(n) }
