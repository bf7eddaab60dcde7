// Package schema is the contract of what gcagent publishes: one Action per
// thing the agent did or decided, its kinds and actions. The publisher
// (natsbus), the components that act (gc, logs) and the fleet viewer use
// these names, so a payload means the same everywhere. See docs/nats.md.
package schema

// Action is one thing the agent did or decided, published as one
// CloudEvent.
type Action struct {
	// Kind is the object kind: image, container, log, gc, agent.
	Kind string
	// Action is what happened to it: removed, skipped, started, completed, failed, heartbeat.
	Action string
	// Subject names the object in the CloudEvent (image digest, container id, path); never put into a NATS subject.
	Subject string
	// Key identifies this action among all actions of the same node, kind and
	// action, and must be the same if the caller submits the same action again
	// (for example "sha256:…/cycle-42"): the event id is derived from it. An
	// empty Key gets a random one, so the event is still exactly-once from the
	// outbox on, but a re-submission by the caller is a second event.
	Key string
	// Data is marshalled to JSON as the event's data; nil means no data.
	Data any
}

// The kinds of object an action is about.
const (
	KindImage     = "image"
	KindContainer = "container"
	KindLog       = "log"
	KindGC        = "gc"
	KindAgent     = "agent"
)

// The actions done to an object.
const (
	ActionRemoved = "removed"
	ActionSkipped = "skipped"
	// ActionRegretted says an image the agent deleted came back on the
	// node within the regret window (image.regretted).
	ActionRegretted = "regretted"
)

// ReasonDryRun is the reason of every *.skipped action of a dry run: it
// would have been removed.
const ReasonDryRun = "dry-run"
