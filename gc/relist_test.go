package gc

import (
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// TestRelistTellsAnImagePulledAgain: an image first seen long ago is
// deleted while the agent is away (the kubelet's own GC, crictl rmi) and
// pulled again under its name (the kubelet, for a pod it is about to
// start) a few seconds before the agent relists. Every name on the digest
// is a record made since the agent last saw it: the image is a new one to
// the node, first seen now, and too young to delete, as a pull the agent
// watched would be. The stale first-seen time made it the oldest image,
// deleted under pressure before the kubelet could create its container.
// A name merely added to an image the agent knows changes nothing.
func TestRelistTellsAnImagePulledAgain(t *testing.T) {
	policy := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 0, MinAge: 2 * time.Minute}
	pressure := DiskStats{CapacityBytes: 1000, AvailableBytes: 100}
	seen := func(d time.Duration, name, digest string, created time.Time) events.ImageUpserted {
		e := pull(d, name, digest, 10)
		e.Created = created
		return e
	}
	s := build(seen(0, "example.test/app:1", "sha256:app", at(0)), seen(0, "example.test/old:1", "sha256:old", at(0)),
		events.Synced{At: at(time.Second)})
	now := at(time.Hour)
	l := events.Listing{At: now, Images: []events.ImageUpserted{
		seen(0, "example.test/app:1", "sha256:app", now.Add(-10*time.Second)), // pulled again while the agent was away
		seen(0, "example.test/old:1", "sha256:old", at(0)),                    // there all along
		seen(0, "example.test/old:2", "sha256:old", now.Add(-10*time.Second)), // a tag added meanwhile
	}}
	for _, ev := range projection.Reconcile(s, l) {
		s.Apply(ev)
	}
	plan := PlanImages([]*projection.State{s}, pressure, policy, now)
	reasons := map[string]Reason{}
	for _, it := range plan.Keep {
		reasons[it.Digest] = it.Reason
	}
	for _, it := range plan.Delete {
		reasons[it.Digest] = "delete"
	}
	if reasons["sha256:app"] != ReasonTooYoung {
		t.Errorf("the image pulled again 10 s before the relist: %q, want %q", reasons["sha256:app"], ReasonTooYoung)
	}
	if reasons["sha256:old"] != "delete" {
		t.Errorf("the image there all along (a tag added): %q, want it deleted", reasons["sha256:old"])
	}
}

// TestRelistKeepsAnImageThatLostAName: an image loses, while the agent
// watches, the name whose record was its earliest; a relist finds its
// other, later name: not an image pulled again, its first-seen time kept.
func TestRelistKeepsAnImageThatLostAName(t *testing.T) {
	seen := func(d time.Duration, name string, created time.Time) events.ImageUpserted {
		e := pull(d, name, "sha256:app", 10)
		e.Created = created
		return e
	}
	s := build(seen(0, "example.test/app:1", at(0)), seen(0, "example.test/app:2", at(time.Minute)),
		events.ImageDeleted{At: at(2 * time.Minute), Name: "example.test/app:1"}, events.Synced{At: at(2 * time.Minute)})
	for _, ev := range projection.Reconcile(s, events.Listing{At: at(time.Hour), Images: []events.ImageUpserted{seen(0, "example.test/app:2", at(time.Minute))}}) {
		s.Apply(ev)
	}
	if img := s.Images["sha256:app"]; img == nil || !img.FirstSeen.Time().Equal(at(0)) {
		t.Errorf("after the relist: %+v, want first seen at %s", img, at(0))
	}
}
