package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/schema"
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

// logsDeletes makes each log removal a delete transaction (the cleaner
// calls IntendRemoval, removes, then PublishRemoval or AbandonRemoval for
// the same removal, one at a time).
type logsDeletes struct {
	d   *deletion.Manager
	pub gc.Publisher

	mu  sync.Mutex
	txs map[string]*deletion.Tx // by path: one removal of a path at a time
}

var (
	_ logs.Publisher       = (*logsDeletes)(nil)
	_ logs.RemovalIntender = (*logsDeletes)(nil)
)

// IntendRemoval begins r's delete transaction.
func (p *logsDeletes) IntendRemoval(ctx context.Context, r logs.Removal) error {
	tx, err := p.d.Begin(ctx, "", logAction(r, ""))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.txs[filepath.Join(r.Dir, r.Name)] = tx
	p.mu.Unlock()
	return nil
}

func (p *logsDeletes) take(r logs.Removal) *deletion.Tx {
	path := filepath.Join(r.Dir, r.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	tx := p.txs[path]
	delete(p.txs, path)
	return tx
}

// AbandonRemoval aborts r's transaction: the removal did not happen.
func (p *logsDeletes) AbandonRemoval(_ context.Context, r logs.Removal) error {
	if tx := p.take(r); tx != nil {
		return tx.Abort()
	}
	return nil
}

// PublishRemoval commits r's transaction with r as the event's data; a
// dry run's is published as log.skipped with reason dry-run.
func (p *logsDeletes) PublishRemoval(_ context.Context, r logs.Removal) error {
	if tx := p.take(r); tx != nil {
		return tx.Commit(logRemoval{Removal: r, Namespace: events.CRINamespace})
	}
	a := logAction(r, "@"+strconv.FormatInt(r.At.UnixNano(), 10))
	if r.DryRun {
		a.Action, a.Key = schema.ActionSkipped, a.Key+"#dry-run"
		a.Data = logSkip{logRemoval: logRemoval{Removal: r, Namespace: events.CRINamespace}, SkipReason: schema.ReasonDryRun}
	}
	return p.pub.Publish(a)
}

// logAction is the log.removed action of r; with an intent its key is made
// unique by the outbox, so it needs no time.
func logAction(r logs.Removal, suffix string) gc.Action {
	path := filepath.Join(r.Dir, r.Name)
	return gc.Action{Kind: schema.KindLog, Action: schema.ActionRemoved, Subject: path, Key: string(r.Kind) + ":" + path + suffix,
		Data: logRemoval{Removal: r, Namespace: events.CRINamespace}}
}

// logRemoval is the data of log.removed: kubelet logs are of pods in CRI's
// namespace.
type logRemoval struct {
	logs.Removal
	Namespace string `json:"namespace"`
}

// logSkip is the data of log.skipped.
type logSkip struct {
	logRemoval
	SkipReason string `json:"skipReason"`
}
