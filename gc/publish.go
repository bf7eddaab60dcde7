package gc

import "github.com/gcagent/gcagent/schema"

// Action is one thing GC did or decided, published to the fleet as one
// event (schema.Action).
type Action = schema.Action

// Publisher hands actions to the fleet bus. Publish must not block on the
// network: GC never waits for NATS.
type Publisher interface {
	Publish(a Action) error
}

// Discard is a Publisher that drops everything, for tools and tests.
type Discard struct{}

// Publish drops a.
func (Discard) Publish(Action) error { return nil }
