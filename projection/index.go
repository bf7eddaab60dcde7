package projection

import (
	"slices"
	"time"
)

// rootKey picks the key of the image c's rootfs runs: CRI's image id
// (exact); else the target its name resolved to when that image's top layer
// is the rootfs snapshot's parent (the name still says what it runs); else,
// when the name moved or is unknown, the parent chain itself, which holds
// every image with that top layer; else the name's target.
func (s *State) rootKey(c *Container) UseKey {
	switch {
	case c.ImageID != "":
		return configKey(c.ImageID)
	case c.RootChain != "":
		if img := s.Images[c.ImageDigest]; img != nil && img.ChainID == c.RootChain {
			return targetKey(c.ImageDigest)
		}
		return chainKey(c.RootChain)
	}
	return targetKey(c.ImageDigest)
}

// contentKeys are the use keys that name img by its content, when known:
// its config digest, then its chain id.
func (img *Image) contentKeys() [2]UseKey {
	return [2]UseKey{configKey(img.ConfigDigest), chainKey(img.ChainID)}
}

// DeadContainers calls f with each dead container (see Dead), in no
// order, until f returns false: a look at the dead ones costs nothing per
// live container.
func (s *State) DeadContainers(f func(*Container) bool) {
	for _, c := range s.dead {
		if !f(c) {
			return
		}
	}
}

// InUse reports whether any container holds a key of the image with this
// target digest (or, for a digest no image has, the digest itself).
func (s *State) InUse(digest string) bool {
	if img := s.Images[digest]; img != nil {
		return s.ImageInUse(img)
	}
	return s.users.has(targetKey(digest))
}

// ImageInUse is InUse for an image the caller holds: whether any container
// holds one of its keys.
func (s *State) ImageInUse(img *Image) bool {
	return !s.eachUse(img, func(string) bool { return false })
}

// ImageUsers returns the ids of the containers that hold img, sorted; nil
// when none does.
func (s *State) ImageUsers(img *Image) []string {
	var ids []string
	s.eachUse(img, func(id string) bool {
		ids = append(ids, id)
		return true
	})
	slices.Sort(ids)
	return slices.Compact(ids)
}

// DigestUsers is ImageUsers of the image with this target digest; for a
// digest no image has (any more), the containers that hold the digest
// itself.
func (s *State) DigestUsers(digest string) []string {
	if img := s.Images[digest]; img != nil {
		return s.ImageUsers(img)
	}
	return s.users.members(targetKey(digest))
}

// eachUse calls f with each container holding a use key of img (its
// target, then its content keys; a container may come more than once)
// until f returns false; it reports whether f never did.
func (s *State) eachUse(img *Image, f func(id string) bool) bool {
	if !s.users.each(targetKey(img.Digest), f) {
		return false
	}
	for _, k := range img.contentKeys() {
		if !k.IsZero() && !s.users.each(k, f) {
			return false
		}
	}
	return true
}

// LastUsed is now while a container holds the image, else the time the
// last one let go (zero if none ever did).
func (s *State) LastUsed(img *Image, now time.Time) time.Time {
	if s.ImageInUse(img) {
		return now
	}
	return img.LastUsed.Time()
}

// index and unindex keep byKey in step with an image's content keys.
func (s *State) index(img *Image) {
	for _, k := range img.contentKeys() {
		if !k.IsZero() {
			s.byKey.add(k, img.Digest)
		}
	}
}

func (s *State) unindex(img *Image) {
	for _, k := range img.contentKeys() {
		s.byKey.remove(k, img.Digest)
	}
}

// reindex rebuilds byKey from Images and dead from Containers, after
// decoding or copying a state.
func (s *State) reindex() {
	s.byKey = newKeySets()
	for _, img := range s.Images {
		s.index(img)
	}
	s.dead = map[string]*Container{}
	for id, c := range s.Containers {
		if c.Dead() {
			s.dead[id] = c
		}
	}
	s.indexDeletions()
}
