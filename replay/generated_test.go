package replay

import (
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/tracegen"
)

// smallBusyNode is a generated trace small enough for a unit test: three
// days of a node with 600 images.
func smallBusyNode() tracegen.Params {
	return tracegen.Params{Days: 3, Images: 600, Runs: 20000, Capacity: 300 << 30, Other: 30 << 30, Warmup: 24 * time.Hour}
}

// TestReplayGeneratedTrace: replaying the policy that ran on a generated
// trace (the generator's own image GC is the kubelet's LRU, written
// independently of the planner) deletes the same images in the same
// order, at the same instants, and re-pulls the same.
func TestReplayGeneratedTrace(t *testing.T) {
	recs := tracegen.Generate(smallBusyNode())
	res := Simulate(recs, Options{Detail: true})
	rec, rep := res.Recorded, res.Replayed
	t.Logf("recorded: %d deletions, %d re-pulls; replayed: %d, %d; footprint ratio %.2f", rec.Deletions, rec.Repulls,
		rep.Deletions, rep.Repulls, res.FootprintRatio)
	if rec.Deletions < 100 {
		t.Fatalf("only %d deletions recorded: no pressure", rec.Deletions)
	}
	if len(rec.Deleted) != len(rep.Deleted) {
		t.Fatalf("replayed %d deletions, recorded %d", len(rep.Deleted), len(rec.Deleted))
	}
	for i := range rec.Deleted {
		a, b := rec.Deleted[i], rep.Deleted[i]
		if a.Digest != b.Digest || !a.T.Equal(b.T) {
			t.Fatalf("deletion %d: recorded %s at %s, replayed %s at %s", i, a.Digest, a.T, b.Digest, b.T)
		}
	}
	if rec.Repulls != rep.Repulls || rec.RepulledBytes != rep.RepulledBytes || rec.PeakUsage != rep.PeakUsage {
		t.Errorf("recorded %+v\nreplayed %+v", rec, rep)
	}
}
