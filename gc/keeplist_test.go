package gc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/projection"
)

// pinnedRef is a digest reference: the only name a digest-pinned pull
// gives an image (besides CRI's image id).
func pinnedRef(repo string) string { return repo + "@sha256:" + strings.Repeat("ab", 32) }

// TestKeepCovers: a keep pattern is a glob on each name as stored and in
// its short form; a repository pattern (REPO or REPO:*) also covers the
// repository's digest references, which a tag glob (REPO:1.*) does not.
func TestKeepCovers(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"registry.example/app:*", "registry.example/app:7", true},
		{"registry.example/app:*", pinnedRef("registry.example/app"), true},
		{"registry.example/app", pinnedRef("registry.example/app"), true},
		{"registry.example/app", "registry.example/app:7", true},
		{"registry.example/*:*", pinnedRef("registry.example/app"), true},
		{"registry.example/app@sha256:*", pinnedRef("registry.example/app"), true},
		{"docker.io/library/nginx:*", pinnedRef("docker.io/library/nginx"), true},
		{"nginx:*", pinnedRef("docker.io/library/nginx"), true},
		{"nginx", "docker.io/library/nginx:1.25", true},
		{"nginx:*", "docker.io/library/nginx:1.25", true},
		{"localhost:5000/app:*", pinnedRef("localhost:5000/app"), true},
		{"localhost:5000/app", "localhost:5000/app:1", true},
		{"registry.example/app:1.*", "registry.example/app:1.2", true},
		{"sha256:*", "sha256:" + strings.Repeat("cd", 32), true},
		// Not covered.
		{"registry.example/app:1.*", pinnedRef("registry.example/app"), false},
		{"registry.example/app:7", pinnedRef("registry.example/app"), false},
		{"registry.example/app@sha256:*", "registry.example/app:7", false},
		{"registry.example/app:*", pinnedRef("registry.example/app/sub"), false},
		{"registry.example/app:*", pinnedRef("registry.example/application"), false},
		{"registry.example/app", "registry.example/app/sub:1", false},
		{"registry.example/app:*", "sha256:" + strings.Repeat("cd", 32), false},
		{"sha256", "sha256:" + strings.Repeat("cd", 32), false},
		{"*", pinnedRef("registry.example/app"), false},
		{"nginx:*", pinnedRef("quay.io/nginx/nginx"), false},
	} {
		if got := keepMatch(c.pattern, c.name); got != c.want {
			t.Errorf("%s covers %s: %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

// TestKeepCoversANameWithTagAndDigest (issue 40, item 9): a name that
// carries both a tag and a digest (nginx:1.25@sha256:...) is covered by
// a tag pattern of its tag, as stored and in short form, and by a digest
// pattern of its digest; not by another tag. On d7dd547 no tag pattern
// other than a repository pattern covered it.
func TestKeepCoversANameWithTagAndDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	name := "docker.io/library/nginx:1.25@" + digest
	for _, c := range []struct {
		pattern string
		want    bool
	}{
		{"nginx:1.25", true},
		{"nginx:1.*", true},
		{"docker.io/library/nginx:1.25", true},
		{"docker.io/library/*:1.25", true},
		{"nginx@" + digest, true},
		{"nginx@sha256:*", true},
		{"nginx:*", true},
		{"nginx", true},
		{"nginx:1.25@" + digest, true},
		// Not covered.
		{"nginx:1.24", false},
		{"nginx:1.2", false},
		{"nginx@sha256:" + strings.Repeat("cd", 32), false},
		{"redis:1.25", false},
	} {
		if got := KeepCovers(c.pattern, name); got != c.want {
			t.Errorf("%s covers %s: %v, want %v", c.pattern, name, got, c.want)
		}
	}
	if KeepCovers("app:1.25", "registry.example/app:1.25@"+digest) {
		t.Errorf("app:1.25 covers another registry's app")
	}
}

// TestKeepPatternKeepsADigestPinnedImage: under pressure, the plan keeps
// an image pulled by digest (names repo@sha256:... and CRI's image id)
// by the repository's tag pattern, and deletes the one a tag glob names.
func TestKeepPatternKeepsADigestPinnedImage(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	s := projection.New()
	for _, ev := range []events.ImageUpserted{
		{At: now.Add(-time.Hour), Name: pinnedRef("registry.example/app"), Digest: "sha256:app", Size: 10},
		{At: now.Add(-time.Hour), Name: "sha256:" + strings.Repeat("01", 32), Digest: "sha256:app", Size: 10},
		{At: now.Add(-time.Hour), Name: pinnedRef("registry.example/db"), Digest: "sha256:db", Size: 10},
	} {
		s.Apply(ev)
	}
	p := ImagePolicy{HighThresholdPercent: 1, KeepPatterns: []string{"registry.example/app:*", "registry.example/db:1.*"}}
	plan := PlanImages([]*projection.State{s}, DiskStats{CapacityBytes: 100, AvailableBytes: 10}, p, now)
	if got := imageSummary(plan.Keep); !slices.Equal(got, []string{"sha256:app keep-pattern"}) {
		t.Errorf("keep %v, want the digest-pinned app by its pattern", got)
	}
	if got := imageSummary(plan.Delete); !slices.Equal(got, []string{"sha256:db space"}) {
		t.Errorf("delete %v, want the db image (a tag glob covers no digest reference)", got)
	}
}

// TestDescribeKeepPattern: what ctl keep add and the start log say a
// pattern covers.
func TestDescribeKeepPattern(t *testing.T) {
	for pattern, want := range map[string]string{
		"registry.example/app:*":        "every tag of registry.example/app and every digest-pinned reference registry.example/app@sha256:... (as stored and in short form)",
		"registry.example/app":          "every tag of registry.example/app and every digest-pinned reference registry.example/app@sha256:... (as stored and in short form)",
		"registry.example/app:1.*":      "tags of registry.example/app matching 1.* (also as registry.example/app:TAG@sha256:...), not its digest-pinned references (registry.example/app@sha256:..., no tag to match): add registry.example/app or registry.example/app:* to keep those too",
		"localhost:5000/app:v?":         "tags of localhost:5000/app matching v? (also as localhost:5000/app:TAG@sha256:...), not its digest-pinned references (localhost:5000/app@sha256:..., no tag to match): add localhost:5000/app or localhost:5000/app:* to keep those too",
		"registry.example/app@sha256:*": "digest references matching registry.example/app@sha256:* (as stored and in short form)",
		"sha256:abc*":                   "image ids (sha256:<config digest>) matching sha256:abc*",
	} {
		if got := DescribeKeepPattern(pattern); got != want {
			t.Errorf("%s:\n got %s\nwant %s", pattern, got, want)
		}
	}
}

// TestPlanWaitsForAFleetKeepListNeverRead walks the fleet keep list's
// states: known and stale lists keep by their patterns and nothing waits;
// a list never read keeps every candidate (keep-list-unread, eligible when
// the wait ends) until FleetKeepWait has passed since the wait began, then
// GC goes on with --keep-image only; no wait at all with FleetKeepWait 0.
func TestPlanWaitsForAFleetKeepListNeverRead(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	s := projection.New()
	s.Apply(events.ImageUpserted{At: now.Add(-time.Hour), Name: "registry.example/app:7", Digest: "sha256:app", Size: 10})
	s.Apply(events.ImageUpserted{At: now.Add(-time.Hour), Name: "registry.example/other:1", Digest: "sha256:other", Size: 10})
	s.Apply(events.ImageUpserted{At: now.Add(-time.Hour), Name: "registry.example/mine:1", Digest: "sha256:mine", Size: 10})
	fleet := []string{"registry.example/app:*"}
	wait := 5 * time.Minute
	for _, c := range []struct {
		name       string
		list       KeepList
		wait       time.Duration
		keep, gone []string // digest reason
		until      time.Time
	}{
		{"known", KeepList{Input: KnownInput(now.Add(-time.Second)), Patterns: fleet}, wait,
			[]string{"sha256:app keep-pattern", "sha256:mine keep-pattern"}, []string{"sha256:other space"}, time.Time{}},
		{"stale", KeepList{Input: Input{State: InputStale, Since: now.Add(-time.Hour)}, Patterns: fleet}, wait,
			[]string{"sha256:app keep-pattern", "sha256:mine keep-pattern"}, []string{"sha256:other space"}, time.Time{}},
		{"unknown, waiting", KeepList{Input: Input{Since: now.Add(-time.Minute)}}, wait,
			[]string{"sha256:app keep-list-unread", "sha256:mine keep-pattern", "sha256:other keep-list-unread"}, nil, now.Add(4 * time.Minute)},
		{"unknown, undated: waits from now", KeepList{}, wait,
			[]string{"sha256:app keep-list-unread", "sha256:mine keep-pattern", "sha256:other keep-list-unread"}, nil, now.Add(wait)},
		{"unknown, the wait just ended", KeepList{Input: Input{Since: now.Add(-wait)}}, wait,
			[]string{"sha256:mine keep-pattern"}, []string{"sha256:app space", "sha256:other space"}, time.Time{}},
		{"unknown, no wait", KeepList{Input: Input{Since: now}}, 0,
			[]string{"sha256:mine keep-pattern"}, []string{"sha256:app space", "sha256:other space"}, time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := ImagePolicy{HighThresholdPercent: 1, KeepPatterns: []string{"registry.example/mine:*"}, FleetKeep: c.list, FleetKeepWait: c.wait}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			plan := PlanImages([]*projection.State{s}, DiskStats{CapacityBytes: 100, AvailableBytes: 10}, p, now)
			keep := imageSummary(plan.Keep)
			slices.Sort(keep)
			if !slices.Equal(keep, c.keep) || !slices.Equal(imageSummary(plan.Delete), c.gone) {
				t.Errorf("keep %v delete %v, want keep %v delete %v", keep, imageSummary(plan.Delete), c.keep, c.gone)
			}
			if !plan.KeepListWaitUntil.Equal(c.until) {
				t.Errorf("waits until %s, want %s", plan.KeepListWaitUntil, c.until)
			}
			for _, it := range plan.Keep {
				if it.Reason == ReasonKeepListUnread && (!it.EligibleAt.Equal(c.until) || it.Rule != RuleKeepListUnread) {
					t.Errorf("%s eligible at %s (rule %q), want %s", it.Digest, it.EligibleAt, it.Rule, c.until)
				}
			}
			if !c.until.IsZero() && (!plan.FirstEligibleAt.Equal(c.until) || !strings.Contains(plan.Shortfall(), "2 keep-list-unread (waiting for the fleet keep list until")) {
				t.Errorf("first eligible %s, shortfall %q", plan.FirstEligibleAt, plan.Shortfall())
			}
			if r := ReclaimableBytes([]*projection.State{s}, p, now); r != int64(10*len(c.gone)) {
				t.Errorf("reclaimable %d bytes, want %d", r, 10*len(c.gone))
			}
		})
	}
	if err := (ImagePolicy{FleetKeepWait: -time.Second}).Validate(); err == nil {
		t.Error("a negative wait passed Validate")
	}
}

// TestImageGCWaitsForTheFleetKeepList: on a full disk, image GC deletes
// nothing while the fleet keep list was never read; when it is read (a
// nudge), the image it names stays and the other goes. Without a read,
// the wait's end alone runs the pass that deletes.
func TestImageGCWaitsForTheFleetKeepList(t *testing.T) {
	for _, read := range []bool{true, false} {
		t.Run(map[bool]string{true: "read within the wait", false: "never read"}[read], func(t *testing.T) {
			var list KeepList // never read; the wait began at the harness's start
			p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 0, MinAge: 2 * m, FleetKeepWait: 5 * m}
			evs := []events.Event{
				pull(0, "registry.example/app:7", digestOf("a"), 8*mib),
				pull(0, "registry.example/other:1", digestOf("b"), 8*mib),
				events.Synced{At: at(time.Hour)},
			}
			var h *loopHarness
			h = startImageLoopWith(t, ImageGCOptions{Policy: p, Retry: time.Hour}, func(d *ImageGCDeps) {
				list.Since = at(time.Hour)
				d.FleetKeep = func() KeepList { return list }
			}, 100*mib, 10*mib, 0, evs...)
			h.rt.Add(digestOf("a"), 8*mib, "registry.example/app:7")
			h.rt.Add(digestOf("b"), 8*mib, "registry.example/other:1")
			st := h.g.Status()
			if st.Passes != 1 || len(h.rt.Removed()) != 0 || !strings.Contains(st.LastPass.Shortfall, "2 keep-list-unread") {
				t.Fatalf("first pass: %d passes, removed %v, last %+v", st.Passes, h.rt.Removed(), st.LastPass)
			}
			// A minute on: still nothing.
			h.step(t, time.Minute)
			if len(h.rt.Removed()) != 0 {
				t.Fatalf("removed %v while waiting for the keep list", h.rt.Removed())
			}
			if read {
				list = KeepList{Input: KnownInput(h.clock.Now()), Patterns: []string{"registry.example/app:*"}}
				h.g.Nudge("keep-list")
				h.idle(t)
				if got := h.rt.Removed(); !slices.Equal(got, []string{digestOf("b")}) {
					t.Fatalf("removed %v after the keep list was read, want only b", got)
				}
				return
			}
			// Retries are an hour apart here: the wait's end is a wake of its own.
			if want := at(time.Hour + 5*m); !h.g.Status().NextWake.Equal(want) {
				t.Fatalf("next wake %s, want the wait's end %s", h.g.Status().NextWake, want)
			}
			h.step(t, at(time.Hour+5*m).Sub(h.clock.Now())-time.Millisecond)
			if len(h.rt.Removed()) != 0 {
				t.Fatalf("removed %v at %s, within the wait", h.rt.Removed(), h.clock.Now())
			}
			h.step(t, time.Millisecond)
			if got := h.rt.Removed(); !slices.Equal(got, []string{digestOf("a"), digestOf("b")}) {
				t.Fatalf("removed %v once the wait ended, want both", got)
			}
		})
	}
}

// TestImageGCReconsider: the keep list's first read (or the wait's end)
// runs a pass only when the last plan held an image for the list: below
// the high threshold with a list known from the start, it runs none.
func TestImageGCReconsider(t *testing.T) {
	for _, known := range []bool{true, false} {
		list := KeepList{Input: KnownInput(at(time.Hour))}
		if !known {
			list = KeepList{Input: Input{Since: at(time.Hour)}}
		}
		p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 0, MinAge: 2 * m, FleetKeepWait: 5 * m}
		h := startImageLoopWith(t, ImageGCOptions{Policy: p, Retry: time.Hour}, func(d *ImageGCDeps) {
			d.FleetKeep = func() KeepList { return list }
		}, 100*mib, 10*mib, 0, pull(0, "registry.example/app:7", digestOf("a"), 8*mib), events.Synced{At: at(time.Hour)})
		h.rt.Add(digestOf("a"), 8*mib, "registry.example/app:7")
		passes := h.g.Status().Passes
		h.disk.Free(80 * mib) // below the high threshold: nothing triggers a pass
		h.step(t, h.o.DiskInterval)
		h.g.Reconsider("keep-list")
		// Once Run has taken the request, a manual pass waits for it.
		wait.Until(t, guard, "Reconsider taken", func() bool { return len(h.g.rethinks) == 0 })
		if _, err := h.g.RunNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := h.g.Status().Passes - passes - 1
		if want := map[bool]int{true: 0, false: 1}[known]; got != want {
			t.Errorf("list known %v: %d passes after Reconsider, want %d", known, got, want)
		}
	}
}
