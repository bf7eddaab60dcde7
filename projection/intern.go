package projection

import "strings"

// A State keeps one copy of each string its records share, and the copy is
// its own, made when the state first holds it: an event's strings were
// decoded beside the listing's or the message's bytes, and a state holding
// them would keep those spans of the heap partly used long after the
// listing is garbage.
//
// A digest or a name is held by its image, by every container that uses it
// and by the use index, and a busy node has tens of thousands of each: a
// container finds the image's copy through the image (imageDigest,
// imageName, contentDigest), which costs no table. Strings no image holds,
// a pod's uid, name, namespace and sandbox, a container name, a kind, an
// evict unit, go through the interner.
//
// The interner is a plain map, not unique.Make: unique's weak pointers
// cost microseconds each to create, a sixth of a first start at 10,000
// images. It forgets nothing by itself, so it is rebuilt from what the
// state holds whenever it has doubled since the last rebuild: amortized, a
// constant per call.
type interner struct {
	m     map[string]string
	limit int // rebuild when m reaches it
}

// internFloor is the least size that triggers a rebuild.
const internFloor = 1024

// intern returns the state's copy of v.
func (s *State) intern(v string) string {
	if v == "" {
		return v
	}
	if c, ok := s.strs.m[v]; ok {
		return c
	}
	if len(s.strs.m) >= s.strs.limit { // also a state restored or cloned: no table yet
		s.reintern()
		if c, ok := s.strs.m[v]; ok {
			return c
		}
	}
	v = strings.Clone(v)
	s.strs.m[v] = v
	return v
}

// setInterned sets *dst to v, interned; an unchanged value costs a compare.
func (s *State) setInterned(dst *string, v string) { setShared(dst, v, s.intern) }

// setShared sets *dst to the state's copy of v, as find gives it; an
// unchanged value costs a compare.
func setShared(dst *string, v string, find func(string) string) {
	if *dst != v {
		*dst = find(v)
	}
}

// imageDigest returns the state's copy of target digest d: its image's,
// else a copy of its own.
func (s *State) imageDigest(d string) string {
	if img := s.Images[d]; img != nil {
		return img.Digest
	}
	return strings.Clone(d)
}

// imageName returns the state's copy of image name n: the image's that
// has it, else a copy of its own.
func (s *State) imageName(n string) string {
	if img := s.Images[s.Names[n]]; img != nil {
		if i, ok := img.Names.find(n); ok {
			return img.Names[i].Name
		}
	}
	return strings.Clone(n)
}

// contentDigest returns the state's copy of the digest of content key k
// (a config digest or a chain id): an image's with that content, else a
// copy of its own.
func (s *State) contentDigest(k UseKey) string {
	found := ""
	s.byKey.each(k, func(d string) bool {
		if img := s.Images[d]; img != nil {
			found = img.ConfigDigest
			if k.kind == byChain {
				found = img.ChainID
			}
		}
		return found == ""
	})
	if found != "" {
		return found
	}
	return strings.Clone(k.v)
}

// configDigest and chainID are contentDigest of a config digest (a CRI
// image id) and of a chain id.
func (s *State) configDigest(v string) string { return s.contentDigest(configKey(v)) }
func (s *State) chainID(v string) string      { return s.contentDigest(chainKey(v)) }

// sharedAll returns vs as find gives each, in a new slice; nil and empty
// stay as they are.
func sharedAll(vs []string, find func(string) string) []string {
	if len(vs) == 0 {
		return vs
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = find(v)
	}
	return out
}

// reintern rebuilds the table from the strings the state holds, so what
// it no longer holds is forgotten (and a restored state's strings are the
// copies new records share).
func (s *State) reintern() {
	m := make(map[string]string, max(len(s.strs.m), internFloor))
	keep := func(v string) {
		if v != "" {
			m[v] = v
		}
	}
	for _, c := range s.Containers {
		keep(c.CRIKind)
		keep(c.PodNamespace)
		keep(c.PodUID)
		keep(c.PodName)
		keep(c.ContainerName)
		keep(c.SandboxID)
		if c.evictUnit != c.ID {
			keep(c.evictUnit)
		}
	}
	s.strs = interner{m: m, limit: max(2*len(m), internFloor)}
}
