package gc

import (
	"strconv"
	"time"

	"github.com/rs/zerolog"
)

// Intender is implemented by publishers that record an intent before each
// delete, so that a crash between a delete and its event loses no event:
// after a restart the intent is resolved against the runtime (object gone:
// the event is published; still there: dropped). Executors call it only when
// their Publisher implements it.
type Intender interface {
	// Intend durably records that the caller is about to do a. The next
	// Publish of an action with the same Kind, Action and Subject turns the
	// intent into that action's event, under the intent's event id.
	Intend(a Action) error
	// Abandon drops the intent for a: the delete did not happen.
	Abandon(a Action) error
}

// intendDelete records a's intent when pub is an Intender and reports
// whether it did. A failure to record is logged and the delete goes on: GC
// does not stop because the outbox cannot be written, the event is then
// published without an intent.
func intendDelete(pub Publisher, a Action, log zerolog.Logger) bool {
	in, ok := pub.(Intender)
	if !ok {
		return false
	}
	if err := in.Intend(a); err != nil {
		log.Warn().Err(err).Str("kind", a.Kind).Str("subject", a.Subject).Msg("cannot record the delete intent; deleting without it")
		return false
	}
	return true
}

// abandonDelete drops a's intent after a delete that did not happen.
func abandonDelete(pub Publisher, a Action, intended bool, log zerolog.Logger) {
	if !intended {
		return
	}
	if err := pub.(Intender).Abandon(a); err != nil {
		log.Warn().Err(err).Str("kind", a.Kind).Str("subject", a.Subject).Msg("cannot drop the delete intent; it is resolved at the next start")
	}
}

// imageRemovalKey is the key of an image removal before its intent makes
// it unique: the digest and when the agent first saw the image.
func imageRemovalKey(ns, digest string, firstSeen time.Time) string {
	return scopedKey(ns, digest+"@"+strconv.FormatInt(firstSeen.UnixNano(), 10))
}
