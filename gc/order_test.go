package gc

import (
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// byRank ranks images by the number in their first name's tag.
type byRank map[string]float64

func (r byRank) Rank(it *ImageItem) float64 { return r[it.Digest] }

// TestPlanImagesOrder: with an order, threshold GC takes the candidates
// lowest rank first (ties least recently used first); max-age candidates
// still go first, and the kept ones stay least recently used first.
func TestPlanImagesOrder(t *testing.T) {
	s := build(
		pull(0, "a:1", "sha256:a", 10), pull(time.Second, "b:1", "sha256:b", 10),
		pull(2*time.Second, "c:1", "sha256:c", 10), pull(3*time.Second, "d:1", "sha256:d", 10),
		pull(4*time.Second, "old:1", "sha256:old", 10),
	)
	s.Namespace = "k8s.io"
	now := at(time.Hour)
	disk := DiskStats{CapacityBytes: 100, AvailableBytes: 10} // 90%: free 20 bytes down to 70%
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 70,
		Order: byRank{"sha256:a": 3, "sha256:b": 1, "sha256:c": 1, "sha256:d": 0, "sha256:old": 9}}
	names := func(items []ImageItem) string {
		var out []string
		for _, it := range items {
			out = append(out, strings.TrimPrefix(it.Digest, "sha256:")+"="+string(it.Reason))
		}
		return strings.Join(out, " ")
	}
	plan := PlanImages([]*projection.State{s}, disk, p, now)
	if got, want := names(plan.Delete), "d=space b=space"; got != want {
		t.Errorf("delete %s, want %s", got, want)
	}
	if got, want := names(plan.Keep), "a=not-needed c=not-needed old=not-needed"; got != want {
		t.Errorf("keep %s, want %s", got, want)
	}
	p.MaxAge = 50 * time.Minute
	s2 := build(pull(0, "a:1", "sha256:a", 10), pull(time.Second, "b:1", "sha256:b", 10),
		pull(2*time.Second, "c:1", "sha256:c", 10), pull(3*time.Second, "d:1", "sha256:d", 10),
		pull(30*time.Minute, "old:1", "sha256:old", 10))
	s2.Namespace = "k8s.io"
	plan = PlanImages([]*projection.State{s2}, DiskStats{CapacityBytes: 100, AvailableBytes: 10}, p, now)
	if got, want := names(plan.Delete), "a=max-age b=max-age c=max-age d=max-age"; got != want {
		t.Errorf("with max age: delete %s, want %s", got, want)
	}
	p.MaxAge, p.Order = 0, nil
	plan = PlanImages([]*projection.State{s}, disk, p, now)
	if got, want := names(plan.Delete), "a=space b=space"; got != want {
		t.Errorf("least recently used: delete %s, want %s", got, want)
	}
}
