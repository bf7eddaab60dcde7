package replay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

var t0 = time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// tb builds a trace by hand, one record per call, in the order given.
type tb struct{ recs []trace.Record }

func (b *tb) add(r trace.Record) *tb {
	if r.NS == "" && r.Digest != "" {
		r.NS = "k8s.io"
	}
	b.recs = append(b.recs, r)
	return b
}

func (b *tb) policy(d time.Duration, high, low int, minAge time.Duration, keep ...string) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindPolicy, Policy: &trace.Policy{High: high, Low: low,
		MinAge: trace.Duration(minAge), KeepPatterns: keep}})
}

func (b *tb) image(d time.Duration, digest string, size int64, names ...string) *tb {
	if len(names) == 0 {
		names = []string{digest + ":1"}
	}
	return b.add(trace.Record{T: at(d), Ev: trace.KindImage, Digest: digest, Names: names, Size: size})
}

func (b *tb) use(d time.Duration, digest string) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindUse, Digest: digest})
}

func (b *tb) idle(d time.Duration, digest string) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindIdle, Digest: digest})
}

func (b *tb) disk(d time.Duration, capacity, avail uint64, trigger string) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindDisk, Disk: &trace.Disk{Capacity: capacity, Available: avail}, Trigger: trigger})
}

func (b *tb) removedByAgent(d time.Duration, digest string, freed int64) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindRemoved, Digest: digest, By: trace.ByAgent, Rule: "space",
		Trigger: "disk", Freed: freed})
}

func (b *tb) removedByOther(d time.Duration, digest string) *tb {
	return b.add(trace.Record{T: at(d), Ev: trace.KindRemoved, Digest: digest, By: trace.ByOther})
}

// override is the recorded policy (the kubelet's before one) changed by f.
func override(f func(*gc.ImagePolicy)) func(*trace.Policy) gc.ImagePolicy {
	return func(p *trace.Policy) gc.ImagePolicy {
		pol := DefaultPolicy()
		if p != nil {
			pol = PolicyOf(*p)
		}
		f(&pol)
		return pol
	}
}

func (b *tb) run(o Options) Result {
	o.Detail = true
	return Simulate(trace.Canonical(b.recs), o)
}

// plan writes deletions as digest@offset/rule/trigger, returned ones with
// ->offset.
func plan(ds []Deletion) string {
	var out []string
	for _, d := range ds {
		s := fmt.Sprintf("%s@%s/%s/%s", d.Digest, d.T.Sub(t0), d.Rule, d.Trigger)
		if !d.Returned.IsZero() {
			s += "->" + d.Returned.Sub(t0).String()
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// fourImages: a used from 10s to 20s, b from 30s to 40s, c never, d from
// 50s on; 100 bytes each on a 1000-byte disk.
func fourImages() *tb {
	b := &tb{}
	b.policy(0, 85, 80, 0)
	b.image(0, "a", 100).image(time.Second, "b", 100).image(2*time.Second, "c", 100).image(3*time.Second, "d", 100)
	b.use(10*time.Second, "a").idle(20*time.Second, "a").use(30*time.Second, "b").idle(40*time.Second, "b")
	b.use(50*time.Second, "d")
	return b
}

func TestReplayThresholdCrossed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		avail uint64 // at 60s
		want  string
	}{
		// 84%: below the high threshold, nothing goes.
		{"below high", 160, ""},
		// 86%: down to 80% is 60 bytes: the never-used image first.
		{"crossed", 140, "c@1m0s/space/disk"},
		// 95%: 150 bytes: c, then a (least recently used); d runs.
		{"far above", 50, "c@1m0s/space/disk a@1m0s/space/disk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fourImages().disk(time.Minute, 1000, tc.avail, "")
			res := b.run(Options{})
			if got := plan(res.Replayed.Deleted); got != tc.want {
				t.Errorf("replayed %q, want %q", got, tc.want)
			}
			if res.Replayed.Deletions != strings.Count(tc.want, "@") || res.Replayed.DeletedBytes != 100*int64(res.Replayed.Deletions) {
				t.Errorf("counted %d deletions, %d bytes", res.Replayed.Deletions, res.Replayed.DeletedBytes)
			}
		})
	}
	// A higher threshold given to the replay keeps everything.
	res := fourImages().disk(time.Minute, 1000, 50, "").run(Options{Policy: override(func(p *gc.ImagePolicy) {
		p.HighThresholdPercent = 96
	})})
	if res.Replayed.Deletions != 0 || res.Replayed.PeakUsage != 95 {
		t.Errorf("at 96%%: %d deletions, peak %d%%; want none and 95%%", res.Replayed.Deletions, res.Replayed.PeakUsage)
	}
}

// TestReplayMinimumAge: images younger than the minimum age stay; the
// episode deletes the first one the moment it comes of age.
func TestReplayMinimumAge(t *testing.T) {
	b := &tb{}
	b.policy(0, 85, 80, time.Hour)
	b.image(0, "a", 100).image(50*time.Minute, "b", 100)
	b.disk(55*time.Minute, 1000, 50, "") // 95%: both too young
	b.image(2*time.Hour, "late", 1)      // a record after the deadline
	res := b.run(Options{})
	if got, want := plan(res.Replayed.Deleted), "a@1h0m0s/space/min-age b@1h50m0s/space/min-age"; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	// a frees 100 of the 150 bytes: 85%, still at the high threshold
	// until b went.
	if got := res.Replayed.AboveHigh; got != 55*time.Minute {
		t.Errorf("above high for %s, want 55m", got)
	}
}

// TestReplayKeepPatterns: a kept image stays whatever its age; the next
// least recently used goes instead, and when nothing else is left, the
// disk stays above the threshold.
func TestReplayKeepPatterns(t *testing.T) {
	b := &tb{}
	b.policy(0, 85, 80, 0, "nginx:*")
	b.image(0, "n", 100, "docker.io/library/nginx:1.25").image(time.Second, "app", 100)
	b.disk(time.Minute, 1000, 100, "") // 90%: 100 bytes to free
	res := b.run(Options{})
	if got, want := plan(res.Replayed.Deleted), "app@1m0s/space/disk"; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	// The real node, which kept app, fills to 95%: the replay, without
	// app, is at 85%, and only the kept image is left.
	b.disk(2*time.Minute, 1000, 50, "")
	b.disk(3*time.Minute, 1000, 50, "")
	res = b.run(Options{})
	if got, want := plan(res.Replayed.Deleted), "app@1m0s/space/disk"; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	if res.Replayed.AboveHigh != time.Minute || res.Replayed.PeakUsage != 90 || res.Recorded.PeakUsage != 95 {
		t.Errorf("above high %s, peak %d%% (recorded %d%%): want 1m, 90%% and 95%%", res.Replayed.AboveHigh,
			res.Replayed.PeakUsage, res.Recorded.PeakUsage)
	}
}

// TestReplayReturningImage: an image the replayed policy deleted and a
// container later needs is a re-pull, with its bytes and the time it
// stayed away; one the real agent deleted and pulled again is a recorded
// re-pull; the real agent's deletions are the recorded column.
func TestReplayReturningImage(t *testing.T) {
	b := fourImages()
	b.disk(time.Minute, 1000, 140, "disk")
	b.removedByAgent(time.Minute+time.Second, "c", 100)
	b.disk(time.Minute+2*time.Second, 1000, 240, "")
	b.use(5*time.Minute, "c") // the real node pulled c again, and ran it
	// not quite: c was removed on the real node, so it arrives first.
	b.recs = b.recs[:len(b.recs)-1]
	b.image(5*time.Minute, "c", 100).use(5*time.Minute, "c")
	// Later the real node is at 86% again; the replay, 10 bytes higher
	// because its c.. went at the same time, so the same.
	res := b.run(Options{})
	if got, want := plan(res.Replayed.Deleted), "c@1m0s/space/disk->5m0s"; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	if got, want := plan(res.Recorded.Deleted), "c@1m1s/space/disk->5m0s"; got != want {
		t.Errorf("recorded %q, want %q", got, want)
	}
	for name, o := range map[string]Outcome{"recorded": res.Recorded, "replayed": res.Replayed} {
		if o.Repulls != 1 || o.RepulledBytes != 100 {
			t.Errorf("%s: %d re-pulls of %d bytes, want 1 of 100", name, o.Repulls, o.RepulledBytes)
		}
	}
	if res.Replayed.MedianReturn != 4*time.Minute || res.Recorded.MedianReturn != 3*time.Minute+59*time.Second {
		t.Errorf("returns after %s (replayed), %s (recorded)", res.Replayed.MedianReturn, res.Recorded.MedianReturn)
	}

	// A policy that deletes what the real node kept: when a container
	// needs it again, the replay pulls it.
	b = fourImages()
	b.disk(time.Minute, 1000, 150, "") // 85%
	b.idle(2*time.Minute, "d")
	b.use(3*time.Minute, "a")
	res = b.run(Options{Policy: override(func(p *gc.ImagePolicy) {
		p.HighThresholdPercent, p.LowThresholdPercent = 80, 60
	})})
	if got, want := plan(res.Replayed.Deleted), "c@1m0s/space/disk a@1m0s/space/disk->3m0s b@1m0s/space/disk"; got != want {
		t.Errorf("replayed %q, want %q", got, want)
	}
	if res.Replayed.Repulls != 1 || res.Recorded.Repulls != 0 || res.Recorded.Deletions != 0 {
		t.Errorf("replayed %d re-pulls, recorded %d with %d deletions; want 1, 0, 0", res.Replayed.Repulls,
			res.Recorded.Repulls, res.Recorded.Deletions)
	}
}

// TestReplayOtherRemovals: an image someone else removed leaves the
// simulated node too: no deletion of the policy's, no re-pull when it
// comes back.
func TestReplayOtherRemovals(t *testing.T) {
	b := fourImages()
	b.removedByOther(time.Minute, "c")
	b.image(2*time.Minute, "c", 100)
	b.disk(3*time.Minute, 1000, 500, "")
	res := b.run(Options{})
	if res.Replayed.Deletions != 0 || res.Replayed.Repulls != 0 || res.Recorded.Deletions != 0 {
		t.Errorf("%+v", res)
	}
}

// TestReplayGDSF: frequency and size weigh in: an image used often is
// kept over one used once more recently, where LRU does the reverse.
func TestReplayGDSF(t *testing.T) {
	b := &tb{}
	b.policy(0, 85, 80, 0)
	b.image(0, "often", 100).image(0, "once", 100)
	for i := range 5 {
		b.use(time.Duration(10*i+1)*time.Second, "often").idle(time.Duration(10*i+5)*time.Second, "often")
	}
	b.use(time.Minute, "once").idle(time.Minute+time.Second, "once")
	b.disk(2*time.Minute, 1000, 140, "")
	if got := plan(b.run(Options{}).Replayed.Deleted); got != "often@2m0s/space/disk" {
		t.Errorf("lru: %s", got)
	}
	if got := plan(b.run(Options{Order: OrderGDSF}).Replayed.Deleted); got != "once@2m0s/space/disk" {
		t.Errorf("gdsf: %s", got)
	}
}
