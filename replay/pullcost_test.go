package replay

import (
	"testing"
	"time"
)

// TestPullCost: a pull costs the fixed part plus the size over the
// throughput; an image a peer or mirror holds, by its registry host (a
// glob) or by a keep pattern, the fixed part only; bad values are said.
func TestPullCost(t *testing.T) {
	c := PullCost{Fixed: 2 * time.Second, Throughput: 10 << 20, Near: []string{"*.mirror.internal", "registry.example/team-1/*"}}
	for _, tc := range []struct {
		names []string
		want  time.Duration
	}{
		{[]string{"registry.example/team-2/app:1"}, 2*time.Second + 5*time.Second},
		{[]string{"sha256:abc", "eu.mirror.internal/app:1"}, 2 * time.Second},
		{[]string{"registry.example/team-1/app:1"}, 2 * time.Second},
		{[]string{"nginx:1.25"}, 7 * time.Second}, // docker.io: not near
		{nil, 7 * time.Second},
	} {
		if got := c.Of(tc.names, 50<<20); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.names, got, tc.want)
		}
	}
	if got := (PullCost{}).orDefault(); got.Fixed != time.Second || got.Throughput != 32<<20 {
		t.Errorf("zero cost: %+v, want the default", got)
	}
	for _, bad := range []PullCost{{Fixed: -1, Throughput: 1}, {Fixed: 1}, {Throughput: 1, Near: []string{"[x"}}, {Throughput: 1, Near: []string{""}}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: valid", bad)
		}
	}
}

// TestReplayGDSFPricedInTime: GDSF priced in pull time deletes first the
// image whose re-pull costs least per byte it frees: one a mirror holds
// (the fixed cost only), although it was used more recently. LRU and
// GDSF priced in bytes (both images the same size and use count) delete
// the less recently used. The re-pulls' time is the cost model's.
func TestReplayGDSFPricedInTime(t *testing.T) {
	b := &tb{}
	b.policy(0, 85, 80, 0)
	b.image(0, "far", 100, "far.example/app:1").image(0, "near", 100, "mirror.local/app:1")
	b.use(10*time.Second, "far").idle(20*time.Second, "far")
	b.use(30*time.Second, "near").idle(40*time.Second, "near")
	b.disk(2*time.Minute, 1000, 140, "")   // 86%: one image goes
	b.disk(150*time.Second, 1000, 500, "") // room for its return
	b.use(3*time.Minute, "far").use(3*time.Minute, "near")
	cost := PullCost{Fixed: time.Second, Throughput: 100, Near: []string{"mirror.local"}}
	for order, want := range map[string]string{
		OrderLRU:       "far@2m0s/space/disk->3m0s",
		OrderGDSFBytes: "far@2m0s/space/disk->3m0s",
		OrderGDSF:      "near@2m0s/space/disk->3m0s",
	} {
		res := b.run(Options{Order: order, PullCost: cost})
		if got := plan(res.Replayed.Deleted); got != want {
			t.Errorf("%s: %s, want %s", order, got, want)
		}
		// far: 1 s + 100 B at 100 B/s; near: the fixed 1 s.
		wantTime := 2 * time.Second
		if order == OrderGDSF {
			wantTime = time.Second
		}
		if res.Replayed.RepullTime != wantTime || res.PullCost.Throughput != 100 {
			t.Errorf("%s: re-pull time %s (priced %+v), want %s", order, res.Replayed.RepullTime, res.PullCost, wantTime)
		}
	}
}
