package gc

import (
	"strconv"
	"time"

	"github.com/gcagent/gcagent/events"
)

// imageRemovalKey is the key of an image removal before its intent makes
// it unique: the digest and when the agent first saw the image.
func imageRemovalKey(ns, digest string, firstSeen time.Time) string {
	return scopedKey(ns, digest+"@"+strconv.FormatInt(firstSeen.UnixNano(), 10))
}

// scopedKey prefixes an event key with a namespace other than CRI's, so
// the same object in two namespaces gets two keys; CRI's keep the keys
// they had before namespaces were managed.
func scopedKey(ns, key string) string {
	if ns == "" || ns == events.CRINamespace {
		return key
	}
	return ns + "/" + key
}
