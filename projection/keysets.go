package projection

import (
	"maps"
	"slices"
)

// keySets maps use keys to sorted sets of strings: the containers that
// hold a key (State.users), the images a content key names (byKey).
// Nearly every key has one member, kept as the map's value: a slice for
// each key cost a header in the map and an allocation of its own, 0.7 MB
// at 10,000 images and 10,000 containers (BenchmarkStateMemory).
type keySets struct {
	one  map[UseKey]string   // keys with one member
	more map[UseKey][]string // keys with two or more, sorted
}

func newKeySets() keySets {
	return keySets{one: map[UseKey]string{}, more: map[UseKey][]string{}}
}

// add puts v in k's set.
func (ks keySets) add(k UseKey, v string) {
	if set, ok := ks.more[k]; ok {
		ks.more[k] = addSorted(set, v)
		return
	}
	one, ok := ks.one[k]
	switch {
	case !ok:
		ks.one[k] = v
	case one != v:
		delete(ks.one, k)
		ks.more[k] = addSorted([]string{one}, v)
	}
}

// remove takes v out of k's set.
func (ks keySets) remove(k UseKey, v string) {
	if one, ok := ks.one[k]; ok {
		if one == v {
			delete(ks.one, k)
		}
		return
	}
	set, ok := ks.more[k]
	if !ok {
		return
	}
	switch set = removeSorted(set, v); len(set) {
	case 1:
		delete(ks.more, k)
		ks.one[k] = set[0]
	default:
		ks.more[k] = set
	}
}

// has reports whether k's set has any member.
func (ks keySets) has(k UseKey) bool {
	if _, ok := ks.one[k]; ok {
		return true
	}
	return len(ks.more[k]) > 0
}

// each calls f with the members of k's set, in order, until f returns
// false; it reports whether f never did.
func (ks keySets) each(k UseKey, f func(string) bool) bool {
	if one, ok := ks.one[k]; ok {
		return f(one)
	}
	for _, v := range ks.more[k] {
		if !f(v) {
			return false
		}
	}
	return true
}

// members returns k's set in a new slice; nil when empty.
func (ks keySets) members(k UseKey) []string {
	if one, ok := ks.one[k]; ok {
		return []string{one}
	}
	return slices.Clone(ks.more[k])
}

// len is the number of keys with a set.
func (ks keySets) len() int { return len(ks.one) + len(ks.more) }

// clone returns a copy that shares nothing mutable with ks.
func (ks keySets) clone() keySets {
	c := keySets{one: maps.Clone(ks.one), more: make(map[UseKey][]string, len(ks.more))}
	if c.one == nil {
		c.one = map[UseKey]string{}
	}
	for k, set := range ks.more {
		c.more[k] = slices.Clone(set)
	}
	return c
}

// addSorted returns set (sorted, no duplicates) with v in it.
func addSorted(set []string, v string) []string {
	i, found := slices.BinarySearch(set, v)
	if found {
		return set
	}
	return slices.Insert(set, i, v)
}

// removeSorted returns set (sorted) without v.
func removeSorted(set []string, v string) []string {
	i, found := slices.BinarySearch(set, v)
	if !found {
		return set
	}
	return slices.Delete(set, i, i+1)
}
