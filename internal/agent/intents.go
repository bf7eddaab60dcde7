package agent

import (
	"context"
	"time"

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

// settleAtStart settles the deletes a crash left pending, retrying with
// backoff while containerd cannot say, so their events go out without
// waiting for the next delete. GC waits for it: a new delete of the same
// object would make an old intent look done.
func settleAtStart(ctx context.Context, d *deletion.Manager, log zerolog.Logger) error {
	wait := 100 * time.Millisecond
	failures := 0
	for {
		err := d.Settle(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		failures++
		if failures == 1 || failures%10 == 0 {
			log.Warn().Err(err).Int("failures", failures).Float64("retry_in_s", wait.Seconds()).Msg("cannot settle the deletes of the last run yet")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}
