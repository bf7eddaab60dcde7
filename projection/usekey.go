package projection

import "strings"

// UseKey is what a container holds an image by (see Container.UseKeys):
// the image's config digest (the CRI image id), the chain id of its top
// layer, or, when neither is known, its target digest. The digest is the
// string its image or container already holds, so a key costs no string of
// its own: a busy node has three keys for every image and one for every
// container. Its text form, in snapshots and JSON, is the digest with a
// "config:" or "chain:" prefix, as it has always been persisted.
type UseKey struct {
	kind keyKind
	v    string
}

type keyKind uint8

const (
	byTarget keyKind = iota
	byConfig
	byChain
)

// Text prefixes of config and chain keys; a target key has none.
const (
	keyConfig = "config:"
	keyChain  = "chain:"
)

func targetKey(digest string) UseKey { return UseKey{byTarget, digest} }
func configKey(digest string) UseKey { return UseKey{byConfig, digest} }
func chainKey(chain string) UseKey   { return UseKey{byChain, chain} }

// IsZero reports whether k names nothing.
func (k UseKey) IsZero() bool { return k.v == "" }

// String returns k's text form.
func (k UseKey) String() string {
	switch k.kind {
	case byConfig:
		return keyConfig + k.v
	case byChain:
		return keyChain + k.v
	}
	return k.v
}

// parseUseKey reads a key's text form.
func parseUseKey(s string) UseKey {
	if v, ok := strings.CutPrefix(s, keyConfig); ok {
		return configKey(v)
	}
	if v, ok := strings.CutPrefix(s, keyChain); ok {
		return chainKey(v)
	}
	return targetKey(s)
}

// MarshalText writes the text form, so JSON holds a key as before.
func (k UseKey) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads the text form.
func (k *UseKey) UnmarshalText(b []byte) error {
	*k = parseUseKey(string(b))
	return nil
}

// digestOf returns the string c holds that equals v (its image id, root
// chain or image digest), so a key read back from a snapshot shares it
// instead of keeping the key's text alive; v itself when none does.
func (c *Container) digestOf(v string) string {
	for _, d := range [...]string{c.ImageID, c.RootChain, c.ImageDigest} {
		if d == v {
			return d
		}
	}
	return v
}
