package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// run watches the list on nc, in JetStream domain domain ("" the
// server's own; a leaf's agents name the hub's), until ctx ends. With
// create (the agent's own
// embedded server) it creates the bucket (R1) when missing; else a missing
// bucket means no fleet list, looked for again at a jittered backoff up to
// a minute. A failed watch is counted by cause and logged once per cause
// until a watch works again; it is tried again at the same backoff, and at
// once when NATS comes back after being away. The watch confirms the list
// at each heartbeat of the server (KeepUpdate.Alive), never merely
// because the connection is up; a watch that stops delivering ends as
// stalled and is made again.
func (k *fleetKeep) run(ctx context.Context, nc *nats.Conn, domain string, create bool) error {
	js, err := natsbus.NewJetStream(nc, domain)
	if err != nil {
		return err
	}
	backoff, noBucket := time.Second, false
	for {
		if !nc.IsConnected() {
			// A request would only wait for its timeout: wait for NATS
			// instead, and count it as a failure if it does not come.
			if !k.retryWait(ctx, nc, backoff/2+rand.N(backoff/2+1), false) {
				return nil
			}
			if !nc.IsConnected() {
				k.fail(fmt.Errorf("not connected to NATS (%v): %w", nc.LastError(), nats.ErrDisconnected), backoff)
				backoff = min(2*backoff, keepRetryMax)
				continue
			}
		}
		err = nil
		connected := nc.IsConnected()
		if create {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = natsbus.EnsureKeepBucket(wctx, js, 1, natsbus.EmbeddedKeepMaxBytes)
			cancel()
		}
		k.mu.Lock()
		k.seen = map[string]bool{}
		k.mu.Unlock()
		if err == nil {
			err = natsbus.WatchKeep(ctx, js, k.keys, natsbus.KeepWatchOptions{Heartbeat: k.heartbeat}, func(u natsbus.KeepUpdate) {
				backoff = time.Second
				k.recovered()
				k.apply(u)
			})
		}
		k.mu.Lock()
		k.watching = false
		k.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) && nc.IsConnected() && k.heldAList() {
			// The bucket went after a list was read from it: NATS lost its
			// store (a server without persistent storage, restarted) as
			// likely as an operator removed it. The last list keeps
			// (stale) until a bucket is there again; `ctl keep rm` is how
			// patterns go.
			k.fail(fmt.Errorf("the keep list's bucket %s is gone from this NATS: keeping the last list read: %w", natsbus.KeepBucket, err), backoff)
			noBucket = false
		} else if errors.Is(err, jetstream.ErrBucketNotFound) && nc.IsConnected() {
			k.recovered()
			k.apply(natsbus.KeepUpdate{Synced: true}) // NATS says: no list
			if !noBucket {
				// A fleet that never made a keep list: nothing is wrong.
				k.log.Info().Str("bucket", natsbus.KeepBucket).Float64("retry_s", backoff.Seconds()).Msg("no fleet keep list on this NATS yet; looking again")
			}
			noBucket = true
		} else {
			noBucket = false
			k.fail(err, backoff)
		}
		if !k.retryWait(ctx, nc, backoff/2+rand.N(backoff/2+1), connected) {
			return nil
		}
		backoff = min(2*backoff, keepRetryMax)
	}
}

// heldAList reports whether the agent holds a list read from this NATS
// (now, or saved by the run before): one the bucket's disappearance must
// not empty.
func (k *fleetKeep) heldAList() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.own && !k.doc.ConfirmedAt.IsZero() && (len(k.doc.Lists) > 0 || k.cl.last != nil)
}

// retryWait waits d before the next watch, or less when NATS, away
// (!connected) at the last try, is back; false when ctx ended.
func (k *fleetKeep) retryWait(ctx context.Context, nc *nats.Conn, d time.Duration, connected bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-poll.C:
			if !connected && nc.IsConnected() {
				return true
			}
		}
	}
}

// fail records a failed watch: counted by cause, logged once per cause in
// a run of failures (an error for a server too old: the one line that
// says which version the list needs), with what GC keeps meanwhile.
func (k *fleetKeep) fail(err error, retry time.Duration) {
	defer k.markTried()
	cause := natsbus.KeepWatchCause(err)
	k.failures.WithLabelValues(cause).Inc()
	now := k.now()
	k.mu.Lock()
	if k.cause == "" {
		k.failedAt = now
	}
	k.cause, k.failErr = cause, err.Error()
	first := !k.logged[cause]
	k.logged[cause] = true
	in := k.input(now)
	n := len(k.patterns())
	k.mu.Unlock()
	if !first {
		k.log.Debug().Err(err).Str("cause", cause).Msg("fleet keep list not watched")
		return
	}
	e := k.log.Warn()
	if cause == natsbus.KeepCauseServerTooOld {
		e = k.log.Error()
	}
	e = e.Err(err).Str("cause", cause).Float64("retry_s", retry.Seconds()).Str("state", in.State.String())
	switch until := k.waitUntil(); {
	case in.State != gc.InputUnknown:
		e.Int("patterns", n).Msg("fleet keep list not watched: keeping the last list seen")
	case !until.IsZero() && now.Before(until):
		e.Time("wait_until", until).Msg("fleet keep list not watched, never read: image deletes by threshold or maximum age wait for it")
	default:
		e.Msg("fleet keep list not watched, never read: image GC goes on with --keep-image only")
	}
}

// recovered ends a run of failed watches: logged once, with how long it
// lasted.
func (k *fleetKeep) recovered() {
	k.mu.Lock()
	cause, since := k.cause, k.failedAt
	k.cause, k.failErr, k.failedAt = "", "", time.Time{}
	clear(k.logged)
	k.mu.Unlock()
	if cause != "" {
		k.log.Info().Str("cause", cause).Float64("failing_s", k.now().Sub(since).Seconds()).Msg("fleet keep list watched again")
	}
}

// awaitRead says, once, that image deletes wait for a list never read,
// and when the wait ends without a read, says at warn that image GC goes
// on with --keep-image only and calls settled. It returns when the list is
// read, the wait ends or ctx ends.
func (k *fleetKeep) awaitRead(ctx context.Context, timers clock.Timers) {
	until := k.waitUntil()
	if k.everRead() {
		return
	}
	if until.IsZero() {
		k.log.Warn().Msg("no fleet keep list saved: image GC does not wait for one (--keep-list-wait 0s); until NATS answers it keeps by --keep-image only")
		return
	}
	k.log.Info().Time("wait_until", until).Float64("wait_s", k.wait.Seconds()).
		Msg("no fleet keep list saved: image deletes by threshold or maximum age wait for NATS to give one")
	t := timers.NewTimer(max(until.Sub(timers.Now()), 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-k.read:
		return
	case <-t.C():
	}
	if k.everRead() {
		return
	}
	in := k.Input(timers.Now())
	k.log.Warn().Str("cause", in.Cause).Float64("waited_s", k.wait.Seconds()).
		Msg("fleet keep list not read within --keep-list-wait: image GC goes on with --keep-image only")
	if k.settled != nil {
		k.settled()
	}
}
