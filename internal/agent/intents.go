package agent

import (
	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
)

// newDeletes returns the delete transactions of the agent: intents in the
// outbox, settled against the node, each begun only while the agent holds
// containerd's agent lock.
func newDeletes(p *natsbus.Publisher, rt *node.Runtime, lock *node.AgentLock, log zerolog.Logger) (*deletion.Manager, error) {
	o := deletion.Options{Log: log.With().Str("component", "deletion").Logger()}
	crashHooks(&o) // only in a build with -tags testhooks
	return deletion.New(deletion.Deps{Journal: p, Checker: rt, Lock: lock}, o)
}
