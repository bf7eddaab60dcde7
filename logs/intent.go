package logs

import "context"

// RemovalIntender is implemented by publishers that record an intent before
// each removal, so that a crash between a removal and its event loses no
// event (after a restart the intent is resolved by whether the path still
// exists). The Cleaner uses it only when its Publisher implements it; the
// removal's PublishRemoval completes the intent.
type RemovalIntender interface {
	IntendRemoval(ctx context.Context, r Removal) error
	AbandonRemoval(ctx context.Context, r Removal) error
}

// intendRemoval records r's intent when the publisher can; it reports
// whether it did. A failure is logged and the removal goes on.
func (c *Cleaner) intendRemoval(ctx context.Context, r Removal) bool {
	in, ok := c.pub.(RemovalIntender)
	if !ok {
		return false
	}
	if err := in.IntendRemoval(ctx, r); err != nil {
		c.log.Warn().Str("path", r.Dir+"/"+r.Name).Err(err).Msg("cannot record the removal intent; removing without it")
		return false
	}
	return true
}

// abandonRemoval drops r's intent after a removal that did not happen.
func (c *Cleaner) abandonRemoval(ctx context.Context, r Removal, intended bool) {
	if !intended {
		return
	}
	if err := c.pub.(RemovalIntender).AbandonRemoval(ctx, r); err != nil {
		c.log.Warn().Str("path", r.Dir+"/"+r.Name).Err(err).Msg("cannot drop the removal intent; it is resolved at the next start")
	}
}
