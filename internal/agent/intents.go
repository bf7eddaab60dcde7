package agent

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
)

// killAfterDeleteEnv is a test hook, not a setting: when it names a kind
// (image, container, log), the agent sends itself SIGKILL right after its
// first delete of that kind, before the delete's event is stored, so that
// end-to-end tests can show the intent turning into exactly one event
// after the restart.
const killAfterDeleteEnv = "GCAGENT_TEST_KILL_AFTER_DELETE"

// killAfterIntentEnv is the same test hook one step earlier: SIGKILL right
// after the intent is recorded, before the delete.
const killAfterIntentEnv = "GCAGENT_TEST_KILL_AFTER_INTENT"

// newDeletes returns the delete transactions of the agent: intents in the
// outbox, settled against the node.
func newDeletes(p *natsbus.Publisher, rt *node.Runtime, log zerolog.Logger) (*deletion.Manager, error) {
	o := deletion.Options{Log: log.With().Str("component", "deletion").Logger()}
	if kind := os.Getenv(killAfterIntentEnv); kind != "" {
		o.AfterIntent = func(in deletion.Intent) {
			if in.Kind == kind {
				killSelf()
			}
		}
	}
	if kind := os.Getenv(killAfterDeleteEnv); kind != "" {
		o.AfterDelete = func(in deletion.Intent) {
			if in.Kind == kind {
				killSelf()
			}
		}
	}
	return deletion.New(deletion.Deps{Journal: p, Checker: rt}, o)
}

// killSelf is kill -9 of this process, for the test hooks.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught: the process ends here
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
