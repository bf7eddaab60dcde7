package agent

import (
	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
)

// newDeletes returns the delete transactions of the agent: intents in the
// outbox, settled against the node.
func newDeletes(p *natsbus.Publisher, rt *node.Runtime, log zerolog.Logger) (*deletion.Manager, error) {
	o := deletion.Options{Log: log.With().Str("component", "deletion").Logger()}
	crashHooks(&o) // only in a build with -tags testhooks
	return deletion.New(deletion.Deps{Journal: p, Checker: rt}, o)
}
