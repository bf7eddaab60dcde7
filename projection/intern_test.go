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

	// Churn: many pods' containers come and go; the table keeps only what
	// is held.
	for i := range 5 * internFloor {
		id := fmt.Sprintf("churn-%08d", i)
		s.Apply(events.ContainerUpserted{At: at(10), ID: id, Image: fresh(name), PodUID: id, PodName: id, SandboxID: id})
		s.Apply(events.ContainerDeleted{At: at(11), ID: id})
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

// TestStateOwnsItsStrings: no string a record holds is the event's own
// (decoded beside a listing's or a message's bytes, which it would keep
// from being freed); equal ones of a pod's containers are one copy.
func TestStateOwnsItsStrings(t *testing.T) {
	img := events.ImageUpserted{At: at(0), Name: fresh("example.test/app:1"), Digest: fresh("sha256:aaaa"),
		ConfigDigest: fresh("sha256:cfg"), ChainID: fresh("sha256:chain")}
	ctr := func(id string) events.ContainerUpserted {
		return events.ContainerUpserted{At: at(1), ID: fresh(id), Image: fresh(img.Name), ImageDigest: fresh(img.Digest),
			CRIKind: fresh(KindContainer), PodUID: fresh("uid-1"), PodName: fresh("pod"), PodNamespace: fresh("default"),
			ContainerName: fresh("app"), SandboxID: fresh("sb-1"), ImageID: fresh("sha256:cfg"), RootChain: fresh("sha256:chain"),
			VolumeImageIDs: []string{fresh("sha256:vol")}, VolumeChains: []string{fresh("sha256:volchain")}}
	}
	e1, e2 := ctr("c1"), ctr("c2")
	s := apply(New(), img, e1, e2)
	c1, c2 := s.Containers["c1"], s.Containers["c2"]
	held := map[string][2]string{
		"id": {c1.ID, e1.ID}, "image": {c1.Image, e1.Image}, "digest": {c1.ImageDigest, e1.ImageDigest},
		"kind": {c1.CRIKind, e1.CRIKind}, "pod uid": {c1.PodUID, e1.PodUID}, "pod name": {c1.PodName, e1.PodName},
		"pod namespace": {c1.PodNamespace, e1.PodNamespace}, "container name": {c1.ContainerName, e1.ContainerName},
		"sandbox": {c1.SandboxID, e1.SandboxID}, "image id": {c1.ImageID, e1.ImageID}, "root chain": {c1.RootChain, e1.RootChain},
		"volume image": {c1.VolumeImageIDs()[0], e1.VolumeImageIDs[0]}, "volume chain": {c1.VolumeChains()[0], e1.VolumeChains[0]},
		"image name": {s.Images[img.Digest].Names[0].Name, img.Name}, "image digest": {s.Images[img.Digest].Digest, img.Digest},
		"config": {s.Images[img.Digest].ConfigDigest, img.ConfigDigest}, "chain": {s.Images[img.Digest].ChainID, img.ChainID},
	}
	for what, p := range held {
		if p[0] != p[1] {
			t.Fatalf("%s: %q, want %q", what, p[0], p[1])
		}
		if same(p[0], p[1]) {
			t.Errorf("%s: the state holds the event's string, not a copy of its own", what)
		}
	}
	for what, p := range map[string][2]string{"pod uid": {c1.PodUID, c2.PodUID}, "pod name": {c1.PodName, c2.PodName},
		"sandbox": {c1.SandboxID, c2.SandboxID}, "image id": {c1.ImageID, s.Images[img.Digest].ConfigDigest}} {
		if !same(p[0], p[1]) {
			t.Errorf("%s: two copies of %q", what, p[0])
		}
	}
}
