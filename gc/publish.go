package gc

// Action is one thing GC did or decided, published to the fleet as one
// event. Key must be the same if the same action is submitted again (a
// retry after a crash), so the event id stays the same and JetStream drops
// the duplicate; it must differ for a different action.
type Action struct {
	Kind    string // image, container, gc
	Action  string // removed, skipped, started, completed, failed
	Subject string // image digest, container id: never put into a NATS subject
	Key     string
	Data    any
}

// Publisher hands actions to the fleet bus. Publish must not block on the
// network: GC never waits for NATS.
type Publisher interface {
	Publish(a Action) error
}

// Discard is a Publisher that drops everything, for tools and tests.
type Discard struct{}

// Publish drops a.
func (Discard) Publish(Action) error { return nil }
