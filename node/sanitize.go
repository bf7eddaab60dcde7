package node

import "time"

// knownTopics are the topics containerd's own services publish. Any client
// with the socket can publish an event on a topic of its choosing, so a
// metric label taken from the topic as it is would let one client grow the
// agent's series without bound (or crash the exporter with bytes that are
// not UTF-8); topicLabel maps everything else to "other".
var knownTopics = map[string]bool{}

func init() {
	for _, t := range []string{
		"/containers/create", "/containers/update", "/containers/delete",
		"/images/create", "/images/update", "/images/delete",
		"/content/create", "/content/delete",
		"/namespaces/create", "/namespaces/update", "/namespaces/delete",
		"/snapshot/prepare", "/snapshot/commit", "/snapshot/remove",
		"/sandboxes/create", "/sandboxes/start", "/sandboxes/exit", "/sandboxes/delete",
		"/tasks/create", "/tasks/start", "/tasks/delete", "/tasks/exit", "/tasks/oom",
		"/tasks/exec-added", "/tasks/exec-started", "/tasks/paused", "/tasks/resumed", "/tasks/checkpointed",
	} {
		knownTopics[t] = true
	}
}

// topicLabel is the metric label of an envelope's topic: the topic itself
// when containerd publishes it, else "other".
func topicLabel(topic string) string {
	if knownTopics[topic] {
		return topic
	}
	return "other"
}

// inJSONRange reports whether t can be written to the journal: JSON (RFC
// 3339) times need a four-digit year. Event times come from clients (a
// forwarded envelope carries its own timestamp, a task exit its own
// exited_at), and one time out of range would fail every journal batch and
// snapshot that holds it.
func inJSONRange(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}
