package projection

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/gcagent/gcagent/events"
)

// same reports whether a and b are one copy in memory.
func same(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// fresh returns a copy of s in memory of its own, as a decoded event has.
func fresh(s string) string { return strings.Clone(s) }

// TestInternShares: records that hold equal strings hold one copy, also
// in a state restored from a snapshot; the table forgets what the state
// no longer holds, and stays within twice what it holds.
func TestInternShares(t *testing.T) {
	const digest, name = "sha256:aaaa", "example.test/app:1"
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: fresh(name), Digest: fresh(digest), Size: 100},
		events.ContainerUpserted{At: at(1), ID: "c1", Image: fresh(name), ImageDigest: fresh(digest)},
		events.ContainerUpserted{At: at(2), ID: "c2", Image: fresh(name), ImageDigest: fresh(digest)},
	)
	img, c1, c2 := s.Images[digest], s.Containers["c1"], s.Containers["c2"]
	if !same(img.Digest, c1.ImageDigest) || !same(c1.ImageDigest, c2.ImageDigest) || !same(c1.Image, c2.Image) {
		t.Fatal("equal digests and names are not one copy")
	}

	// Restored: a new record shares the restored records' copies.
	r, err := decodeSnapshot(encodeSnapshot(s))
	if err != nil {
		t.Fatal(err)
	}
	r.Apply(events.ContainerUpserted{At: at(3), ID: "c3", Image: fresh(name), ImageDigest: fresh(digest)})
	if !same(r.Containers["c3"].ImageDigest, r.Images[digest].Digest) {
		t.Fatal("a new record does not share the restored image's digest")
	}

	// Churn: many images come and go; the table keeps only what is held.
	for i := range 5 * internFloor {
		d := fmt.Sprintf("sha256:%08d", i)
		s.Apply(events.ImageUpserted{At: at(10), Name: d, Digest: d})
		s.Apply(events.ImageDeleted{At: at(11), Name: d})
	}
	if n := len(s.strs.m); n > internFloor {
		t.Fatalf("table holds %d strings after a churn of %d images, over its floor %d", n, 5*internFloor, internFloor)
	}
	// What is held stays shared after the rebuilds.
	s.Apply(events.ContainerUpserted{At: at(12), ID: "c4", Image: fresh(name), ImageDigest: fresh(digest)})
	if !same(s.Containers["c4"].ImageDigest, img.Digest) || !same(s.Containers["c4"].Image, c1.Image) {
		t.Fatal("a held string lost its one copy in a rebuild")
	}
}
