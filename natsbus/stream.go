package natsbus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// streamDescription marks a stream gcagent created. Only such a stream has
// its bounds brought to this agent's settings; a stream made another way
// (an operator's, with its own description) is used as it is.
const streamDescription = "gcagent events, one CloudEvent per action"

// wantStream is the stream config this publisher creates.
func (p *Publisher) wantStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        p.opts.Stream,
		Description: streamDescription,
		Subjects:    []string{EventPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      p.opts.StreamMaxAge,
		MaxBytes:    p.opts.StreamMaxBytes,
		Duplicates:  p.opts.DuplicateWindow,
		Replicas:    p.opts.Replicas,
	}
}

// streamBounds are the settings of an existing gcagent stream this
// publisher keeps at its own values: the bounds it derives from its options.
// Subjects, storage, retention and replicas of an existing stream are left
// as they are (a replica change is an operator's decision).
type streamBounds struct {
	maxBytes         int64
	maxAge, dupeWind time.Duration
}

func boundsOf(c jetstream.StreamConfig) streamBounds {
	return streamBounds{maxBytes: c.MaxBytes, maxAge: c.MaxAge, dupeWind: c.Duplicates}
}

// ensureStream looks the stream up before it asks for anything: a missing
// stream is created; an existing one whose bounds equal this publisher's is
// used without a request (asking the server to create it again with the
// same config is refused with "insufficient storage resources available"
// when the stream is as large as the embedded server's store, as it is by
// default); a gcagent stream with other bounds is updated and that is logged
// once; when the server refuses the update, the stream is used as it is and
// one warning says why.
func (p *Publisher) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	want := p.wantStream()
	s, err := p.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = p.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another agent created it meanwhile
			return p.js.Stream(ctx, want.Name)
		}
		if err == nil {
			p.log.Info().Str("stream", want.Name).Int64("max_bytes", want.MaxBytes).Float64("max_age_s", want.MaxAge.Seconds()).
				Msg("stream created")
		}
		return s, err
	}
	if err != nil {
		return nil, err
	}
	have := s.CachedInfo().Config
	if have.Description != streamDescription || boundsOf(have) == boundsOf(want) {
		return s, nil
	}
	next := have
	next.MaxBytes, next.MaxAge, next.Duplicates = want.MaxBytes, want.MaxAge, want.Duplicates
	updated, uerr := p.js.UpdateStream(ctx, next)
	if uerr == nil {
		p.log.Info().Str("stream", want.Name).Int64("max_bytes", next.MaxBytes).Float64("max_age_s", next.MaxAge.Seconds()).
			Float64("duplicate_window_s", next.Duplicates.Seconds()).Int64("was_max_bytes", have.MaxBytes).Float64("was_max_age_s", have.MaxAge.Seconds()).
			Float64("was_duplicate_window_s", have.Duplicates.Seconds()).Msg("stream config updated")
		return updated, nil
	}
	if !p.warnedCfg {
		p.warnedCfg = true
		p.log.Warn().Err(uerr).Str("stream", want.Name).Int64("max_bytes", have.MaxBytes).Float64("max_age_s", have.MaxAge.Seconds()).
			Int64("want_max_bytes", want.MaxBytes).Float64("want_max_age_s", want.MaxAge.Seconds()).
			Msg("the server refuses this agent's stream config: using the existing stream as it is (delete it to get the new bounds)")
	}
	return s, nil
}
