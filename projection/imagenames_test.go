package projection

import (
	"reflect"
	"testing"

	"github.com/gcagent/gcagent/events"
)

// TestImageNamesSorted: names read in any order (a map's, in older
// snapshots) come out sorted, and of a name given twice the last stays.
func TestImageNamesSorted(t *testing.T) {
	pinned := map[string]string{LabelPinned: LabelPinnedValue}
	got := ImageNames{{"b:1", nil}, {"a:1", nil}, {"b:1", pinned}, {"c:1", nil}}.sorted()
	want := ImageNames{{"a:1", nil}, {"b:1", pinned}, {"c:1", nil}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sorted %v, want %v", got, want)
	}
	var ns ImageNames
	for _, n := range []string{"c", "a", "b", "a"} {
		ns.set(n, nil)
	}
	ns.remove("b")
	ns.remove("missing")
	if got := ns.Strings(); !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Fatalf("set and remove: %v", got)
	}
}

// TestImageCurrentWithoutImage: a name whose image the state lacks is not
// current (and is no panic).
func TestImageCurrentWithoutImage(t *testing.T) {
	s := New()
	s.Names["a:1"] = "sha256:gone"
	if imageCurrent(s, events.ImageUpserted{Name: "a:1", Digest: "sha256:gone"}) {
		t.Fatal("a name without its image is current")
	}
}
