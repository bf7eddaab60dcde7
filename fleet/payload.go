package fleet

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

// The payloads fleet reads are schema's, the publishers' own types: a
// field renamed there is renamed here.

// ImageEvent is the data of image.removed and image.skipped.
type ImageEvent = schema.ImageEvent

// schemaImageRegret is the data of image.regretted (RegretEvent).
type schemaImageRegret = schema.ImageRegret

// ContainerEvent is the data of container.removed (and, with a skip
// reason fleet does not read, container.skipped).
type ContainerEvent = schema.ContainerRemoval

// LogEvent is the data of log.removed (and log.skipped).
type LogEvent = schema.LogRemoval

// GCEvent is the data of gc.started, gc.completed and gc.failed.
type GCEvent = schema.GCPass

// StateReset is the data of agent.state_reset.
type StateReset = schema.StateReset

// Heartbeat is what fleet reads of the data of agent.heartbeat
// (schema.Heartbeat), with a figure absent from the payload (an older
// agent's) nil: unknown, not zero.
type Heartbeat struct {
	DiskUsagePercent *int   `json:"diskUsagePercent"`
	Images           *int   `json:"images"`
	Outbox           int    `json:"outbox"`
	NATSMode         string `json:"natsMode"`
}

// typePrefix starts the CloudEvent type of every action: io.gcagent.<kind>.<action>.
const typePrefix = "io.gcagent."

// The actions fleet reads that schema does not name yet.
const (
	actionHeartbeat  = "heartbeat"
	actionStarted    = "started"
	actionStateReset = "state_reset"
	actionCompleted  = "completed"
	actionFailed     = "failed"
)

// SplitType reads the kind and action of a CloudEvent type
// io.gcagent.<kind>.<action>.
func SplitType(typ string) (kind, action string) {
	kind, action, _ = strings.Cut(strings.TrimPrefix(typ, typePrefix), ".")
	return kind, action
}

// Decode returns the data of ev as the view of its type: *ImageEvent,
// *ContainerEvent, *LogEvent, *GCEvent, *Heartbeat or *StateReset; nil for
// a type fleet reads no data of. When the data does not fit the view, it
// returns the view filled as far as it fits and the error.
func Decode(ev natsbus.CloudEvent) (any, error) {
	kind, action := SplitType(ev.Type)
	var v any
	switch {
	case kind == schema.KindImage && action == schema.ActionRegretted:
		v = &RegretEvent{}
	case kind == schema.KindImage:
		v = &ImageEvent{}
	case kind == schema.KindContainer:
		v = &ContainerEvent{}
	case kind == schema.KindLog:
		v = &LogEvent{}
	case kind == schema.KindGC:
		v = &GCEvent{}
	case kind == schema.KindAgent && action == actionHeartbeat:
		v = &Heartbeat{}
	case kind == schema.KindAgent && action == actionStateReset:
		v = &StateReset{}
	default:
		return nil, nil
	}
	if len(ev.Data) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(ev.Data, v); err != nil {
		return v, fmt.Errorf("decode %s data of event %s: %w", ev.Type, ev.ID, err)
	}
	return v, nil
}

// inNamespace prefixes label with a containerd namespace other than CRI's
// (k8s.io is the usual one: said only for the others).
func inNamespace(ns, label string) string {
	if ns == "" || ns == events.CRINamespace {
		return label
	}
	return ns + ": " + label
}

// imageLabel names an image as an operator reads it: its names (tags
// first; the sha256: id names CRI adds say nothing) and the digest,
// shortened. Without a name, the short digest alone.
func imageLabel(names []string, digest string) string {
	var tags []string
	for _, n := range names {
		if !strings.HasPrefix(n, "sha256:") {
			tags = append(tags, n)
		}
	}
	short := shortDigest(digest)
	if len(tags) == 0 {
		return short
	}
	return strings.Join(tags, ",") + " (" + short + ")"
}

// shortDigest keeps the algorithm and 12 hex digits, like docker's ids.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok {
		algo, hex = "", d
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	if algo == "" {
		return hex
	}
	return algo + ":" + hex
}

// containerLabel names a removed container: pod namespace/name and
// container name for CRI containers, with the id shortened; the id alone
// for plain containers (their ids are chosen by people).
func containerLabel(id, podNamespace, podName, container string) string {
	if podName == "" && container == "" {
		return id
	}
	short := id
	if len(short) > 12 {
		short = short[:12]
	}
	return fmt.Sprintf("%s/%s %s (%s)", podNamespace, podName, container, short)
}
