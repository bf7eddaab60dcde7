package projection

import "strings"

// interner keeps one copy of each digest, name, kind and pod field a
// State's records hold: a digest or a name is held by an image, by every
// container that uses it and by the use index, and a busy node has tens of
// thousands of each. The copy is the state's own, made when it is first
// interned: an event's strings were decoded beside the listing's or the
// message's bytes, and a state holding them would keep those spans of the
// heap partly used long after the listing is garbage (a first start at
// 10,000 left 15 MiB so). It is a plain map, not unique.Make: unique's weak
// pointers cost microseconds each to create, a sixth of a first start at
// 10,000 images. It forgets nothing by itself, so it is rebuilt from what
// the state holds whenever it has doubled since the last rebuild:
// amortized, a constant per call.
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

// internAll returns vs with each string interned, in a new slice; nil and
// empty stay as they are.
func (s *State) internAll(vs []string) []string {
	if len(vs) == 0 {
		return vs
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = s.intern(v)
	}
	return out
}

// setInterned sets *dst to v, interned; an unchanged value costs a compare.
func (s *State) setInterned(dst *string, v string) {
	if *dst != v {
		*dst = s.intern(v)
	}
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
	for _, img := range s.Images {
		keep(img.Digest)
		keep(img.ConfigDigest)
		keep(img.ChainID)
		for _, n := range img.Names {
			keep(n.Name)
		}
	}
	for _, c := range s.Containers {
		keep(c.Image)
		keep(c.ImageDigest)
		keep(c.ImageID)
		keep(c.RootChain)
		keep(c.CRIKind)
		keep(c.PodNamespace)
		keep(c.PodUID)
		keep(c.PodName)
		keep(c.ContainerName)
		keep(c.SandboxID)
		for _, v := range c.VolumeImageIDs {
			keep(v)
		}
		for _, v := range c.VolumeChains {
			keep(v)
		}
		if c.evictUnit != c.ID {
			keep(c.evictUnit)
		}
	}
	s.strs = interner{m: m, limit: max(2*len(m), internFloor)}
}
