package natsbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	batchSize       = 256                    // events in flight per round
	retryMin        = 100 * time.Millisecond // first wait after a failed round
	retryMax        = 5 * time.Second        // longest wait after failed rounds
	reprobeInterval = 30 * time.Second       // how often core mode checks whether JetStream appeared
)

var errNotConnected = errors.New("natsbus: not connected to NATS")

// run is the sender: it delivers outbox entries until Close, waking on
// Publish, on connection status changes and on its retry timer.
func (p *Publisher) run(ctx context.Context) {
	defer close(p.done)
	closing := p.closing
	backoff := retryMin
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		n, err := p.flush(ctx)
		if ctx.Err() != nil {
			return
		}
		p.noteErr(err)
		stopping := closing == nil
		wake := p.wake
		var wait time.Duration
		switch {
		case err != nil:
			if stopping {
				return
			}
			wake = nil // back off: new events must not turn a failure into a busy loop
			wait, backoff = backoff, min(2*backoff, retryMax)
		case n > 0:
			backoff = retryMin
			continue
		default:
			backoff = retryMin
			if stopping {
				return
			}
			wait = reprobeInterval
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-closing:
			closing = nil
		case <-wake:
		case <-p.statusWake:
		case <-timer.C:
		}
	}
}

// flush makes one delivery round: drop expired entries, check the server if
// needed, send up to batchSize entries and remove, oldest first, those acked
// with every entry before them. It returns how many entries it removed and
// the first error.
func (p *Publisher) flush(ctx context.Context) (int, error) {
	d, err := p.ob.expire(p.opts.Now())
	if err != nil {
		return 0, err
	}
	p.reportDrop(d)
	if !p.connected.Load() {
		p.sendMode = ""
		p.setMode(ModeDisconnected)
		return 0, errNotConnected
	}
	if p.needProbe() {
		mode, err := p.probe(ctx)
		if err != nil {
			return 0, err
		}
		p.sendMode = mode
		p.maxPayload.Store(p.nc.MaxPayload())
		p.setMode(mode)
	}
	entries, bad, err := p.ob.peek(batchSize)
	p.reportDrop(bad)
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	var done []uint64
	if p.sendMode == ModeCore {
		done, err = p.sendCore(ctx, entries)
	} else {
		done, err = p.sendJetStream(ctx, entries)
	}
	if rerr := p.ob.remove(done); rerr != nil {
		return 0, errors.Join(err, rerr) // the acked entries are sent again: JetStream drops them as duplicates
	}
	n, _ := p.ob.depth()
	p.m.depth.Set(float64(n))
	return len(done), err
}

// jetStreamRequired says why this Publisher must not fall back to core
// publish: a JetStream domain is configured (the stream is in a hub's
// domain), or it has already published to the stream (JetStream that stops
// answering is an outage, not a server without JetStream). "" allows it.
func (p *Publisher) jetStreamRequired() string {
	switch {
	case p.opts.Domain != "":
		return "JetStream domain " + p.opts.Domain + " configured"
	case p.sawJetStream:
		return "the stream was there before"
	}
	return ""
}

func (p *Publisher) needProbe() bool {
	return p.sendMode == "" ||
		p.nc.Stats().Reconnects != p.reconnects ||
		(p.sendMode == ModeCore && p.opts.Now().Sub(p.lastProbe) >= reprobeInterval)
}

// probe asks the server whether it has JetStream and ensures the stream:
// ModeCore when JetStream is not enabled or the stream does not exist (and
// may not be created), ModeJetStream when the stream is there.
func (p *Publisher) probe(ctx context.Context) (string, error) {
	p.reconnects = p.nc.Stats().Reconnects
	p.lastProbe = p.opts.Now()
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckTimeout)
	defer cancel()
	_, err := p.js.AccountInfo(ctx)
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		// nats.go says "not enabled" also when nobody answers the JetStream
		// API: a leaf node cut off from the hub, a cluster without quorum.
		// Core publishes would then go nowhere, so they are sent only to a
		// server that never had JetStream for this Publisher.
		if why := p.jetStreamRequired(); why != "" {
			return "", fmt.Errorf("natsbus: JetStream does not answer (%s): %w; events wait in the outbox", why, err)
		}
		return ModeCore, nil
	}
	if err != nil {
		return "", fmt.Errorf("natsbus: ask the server for JetStream: %w", err)
	}
	var s jetstream.Stream
	if p.opts.NoCreateStream {
		s, err = p.js.Stream(ctx, p.opts.Stream)
	} else {
		s, err = p.ensureStream(ctx)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if why := p.jetStreamRequired(); why != "" {
			return "", fmt.Errorf("natsbus: stream %s not found (%s); events wait in the outbox", p.opts.Stream, why)
		}
		return ModeCore, nil
	}
	if err != nil {
		return "", fmt.Errorf("natsbus: ensure stream %s: %w", p.opts.Stream, err)
	}
	p.sawJetStream = true
	if w := s.CachedInfo().Config.Duplicates; w < p.opts.MaxAge && !p.warnedDup {
		p.warnedDup = true
		p.log.Warn().Str("stream", p.opts.Stream).Float64("duplicate_window_s", w.Seconds()).Float64("max_age_s", p.opts.MaxAge.Seconds()).
			Msg("stream duplicate window is shorter than the outbox max age: a retry after a longer outage may store an event twice")
	}
	return ModeJetStream, nil
}

// sendJetStream publishes entries asynchronously, in order, then waits for
// their acks. It returns the sequences that may leave the outbox, so that
// entries leave it in order: the entries acked before the first one that
// failed (a later entry acked by the server stays and is sent again from the
// failed one on; JetStream drops it as a duplicate), plus the entries NATS
// or the stream refuse for good (over the max payload or the stream's max
// message size), which are dropped wherever they are since they are never
// stored. The error is the first one seen.
func (p *Publisher) sendJetStream(ctx context.Context, entries []entry) ([]uint64, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(entries))
	sent := make([]entry, 0, len(entries))
	var done []uint64
	var err error
	for _, e := range entries {
		f, perr := p.js.PublishMsgAsync(newMsg(e.Subject, e.Node, e.ID, e.Event))
		if errors.Is(perr, nats.ErrMaxPayload) {
			done = append(done, e.seq)
			p.dropPoison(e, perr)
			continue
		}
		if perr != nil {
			err = perr
			break
		}
		p.noteSent(e)
		futures = append(futures, f)
		sent = append(sent, e)
	}
	inOrder := true // every entry sent so far was acked
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			p.m.acks.Inc()
			if ack.Duplicate {
				p.m.duplicates.Inc()
			}
			if inOrder {
				done = append(done, sent[i].seq)
				p.m.published.WithLabelValues(sent[i].Kind).Inc()
			}
		case ferr := <-f.Err():
			if errors.Is(ferr, jetstream.ErrStreamMessageExceedsMaximum) { // the stream never stores it
				done = append(done, sent[i].seq)
				p.dropPoison(sent[i], ferr)
				continue
			}
			inOrder = false
			if err == nil {
				err = ferr
			}
		case <-ctx.Done():
			return done, ctx.Err()
		}
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		p.sendMode = "" // the stream or JetStream went away: check again before the next round
	}
	return done, err
}

// sendCore publishes entries with core NATS and flushes; it returns the
// sequences the server has received.
func (p *Publisher) sendCore(ctx context.Context, entries []entry) ([]uint64, error) {
	var done []uint64
	for _, e := range entries {
		err := p.nc.PublishMsg(newMsg(e.Subject, e.Node, e.ID, e.Event))
		if errors.Is(err, nats.ErrMaxPayload) {
			done = append(done, e.seq)
			p.dropPoison(e, err)
			continue
		}
		if err != nil {
			return done, err
		}
		p.noteSent(e)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckTimeout)
	defer cancel()
	if err := p.nc.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("natsbus: flush: %w", err)
	}
	for _, e := range entries {
		done = append(done, e.seq)
		p.m.published.WithLabelValues(e.Kind).Inc()
	}
	return done, nil
}

func (p *Publisher) noteSent(e entry) {
	if e.seq <= p.maxSent {
		p.m.republishes.Inc()
		return
	}
	p.maxSent = e.seq
}

func (p *Publisher) dropPoison(e entry, err error) {
	p.m.dropped.Inc()
	p.log.Error().Err(err).Str("event_id", e.ID).Str("subject", e.Subject).Int("bytes", len(e.Event)).
		Msg("NATS refuses this event: dropped it from the outbox")
}

func (p *Publisher) reportDrop(d drop) {
	if d.n == 0 {
		return
	}
	p.m.dropped.Add(float64(d.n))
	n, _ := p.ob.depth()
	p.m.depth.Set(float64(n))
	if d.err != nil {
		p.log.Error().Err(d.err).Int("dropped", d.n).Str("oldest_id", d.oldest).Int("depth", n).
			Msg("outbox entry cannot be decoded: dropped it unsent")
		return
	}
	p.log.Error().Int("dropped", d.n).Str("oldest_id", d.oldest).Int("depth", n).
		Int("max_entries", p.opts.MaxEntries).Int64("max_bytes", p.opts.MaxBytes).Float64("max_age_s", p.opts.MaxAge.Seconds()).
		Msg("outbox over its bound: dropped the oldest events unsent")
}

// setMode records the delivery mode and logs each change once.
func (p *Publisher) setMode(mode string) {
	if p.mode.Swap(mode) == mode {
		return
	}
	p.m.setMode(mode)
	switch mode {
	case ModeJetStream:
		p.log.Info().Str("stream", p.opts.Stream).Msg("publishing events to JetStream")
	case ModeCore:
		p.log.Warn().Str("stream", p.opts.Stream).
			Msg("JetStream or the stream is not available on the server: publishing with core NATS (no persistence, no dedupe)")
	case ModeDisconnected:
		n, _ := p.ob.depth()
		p.log.Warn().Int("depth", n).Msg("NATS is not reachable: events wait in the outbox")
	}
}

// noteErr logs a sender error once until it changes or a round succeeds.
func (p *Publisher) noteErr(err error) {
	switch {
	case err == nil:
		if p.lastErr != "" {
			p.log.Info().Msg("delivering events again")
		}
		p.lastErr = ""
	case errors.Is(err, errNotConnected):
		// setMode has logged it
	case err.Error() != p.lastErr:
		p.lastErr = err.Error()
		p.log.Warn().Err(err).Msg("cannot deliver events yet; retrying")
	}
}
