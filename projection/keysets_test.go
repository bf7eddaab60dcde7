package projection

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestKeySetsMatchSortedSlices holds keySets to the plain map of sorted
// slices it replaced, through random adds and removes (duplicates, absent
// members and keys included), and checks that a set of one is never kept
// as a slice.
func TestKeySetsMatchSortedSlices(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ks, want := newKeySets(), map[UseKey][]string{}
	keys := []UseKey{targetKey("sha256:a"), configKey("sha256:a"), chainKey("sha256:b"), targetKey("sha256:c")}
	members := []string{"c1", "c2", "c3", "c4"}
	for i := range 5000 {
		k, v := keys[r.IntN(len(keys))], members[r.IntN(len(members))]
		if r.IntN(2) == 0 {
			ks.add(k, v)
			want[k] = addSorted(want[k], v)
		} else {
			ks.remove(k, v)
			if want[k] = removeSorted(want[k], v); len(want[k]) == 0 {
				delete(want, k)
			}
		}
		if ks.len() != len(want) {
			t.Fatalf("step %d: %d keys, want %d", i, ks.len(), len(want))
		}
		for _, k := range keys {
			var got []string
			ks.each(k, func(v string) bool { got = append(got, v); return true })
			if !slices.Equal(got, want[k]) || !slices.Equal(ks.members(k), want[k]) || ks.has(k) != (len(want[k]) > 0) {
				t.Fatalf("step %d: %v holds %v (members %v, has %v), want %v", i, k, got, ks.members(k), ks.has(k), want[k])
			}
			if set, ok := ks.more[k]; ok && len(set) < 2 {
				t.Fatalf("step %d: %v kept as a slice of %d", i, k, len(set))
			}
		}
	}
	c := ks.clone()
	c.add(keys[0], "c9")
	if slices.Contains(ks.members(keys[0]), "c9") {
		t.Fatal("clone shares a set with its original")
	}
}

// TestKeySetsEachStops: each stops at the first false and says so.
func TestKeySetsEachStops(t *testing.T) {
	ks := newKeySets()
	k := configKey("sha256:a")
	for _, v := range []string{"c3", "c1", "c2"} {
		ks.add(k, v)
	}
	var seen []string
	if ks.each(k, func(v string) bool { seen = append(seen, v); return v != "c2" }) {
		t.Fatal("each reported that f never stopped it")
	}
	if !slices.Equal(seen, []string{"c1", "c2"}) {
		t.Fatalf("saw %v, want [c1 c2]", seen)
	}
}
