package gc

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

const h, m = time.Hour, time.Minute

func TestImagePolicyValidate(t *testing.T) {
	ok := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * m}
	tests := []struct {
		name string
		mod  func(*ImagePolicy)
		want string // substring of the error; empty for valid
	}{
		{"defaults", func(*ImagePolicy) {}, ""},
		{"bounds 0 and 100", func(p *ImagePolicy) { p.HighThresholdPercent, p.LowThresholdPercent = 100, 0 }, ""},
		{"equal thresholds accepted", func(p *ImagePolicy) { p.LowThresholdPercent = 85 }, ""},
		{"high above 100", func(p *ImagePolicy) { p.HighThresholdPercent = 101 }, "high threshold 101%"},
		{"high negative", func(p *ImagePolicy) { p.HighThresholdPercent = -1 }, "high threshold -1%"},
		{"low negative", func(p *ImagePolicy) { p.LowThresholdPercent = -1 }, "low threshold -1%"},
		{"low above high", func(p *ImagePolicy) { p.LowThresholdPercent = 86 }, "above the high threshold 85%"},
		{"negative min age", func(p *ImagePolicy) { p.MinAge = -1 }, "minimum image age"},
		{"negative max age", func(p *ImagePolicy) { p.MaxAge = -1 }, "maximum image age"},
		{"max age equal to min age", func(p *ImagePolicy) { p.MaxAge = 2 * m }, "greater than the minimum"},
		{"max age above min age", func(p *ImagePolicy) { p.MaxAge = 2*m + 1 }, ""},
		{"valid keep patterns", func(p *ImagePolicy) { p.KeepPatterns = []string{"registry.internal/*", "*/agent:v[0-9]*"} }, ""},
		{"malformed keep pattern", func(p *ImagePolicy) { p.KeepPatterns = []string{"ok/*", "bad["} }, `keep pattern "bad["`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.mod(&p)
			wantError(t, p.Validate(), tt.want)
		})
	}
}

func TestPlanImagesDisk(t *testing.T) {
	tests := []struct {
		name                string
		capacity, available uint64
		high, low           int
		usage               int
		triggered, invalid  bool
		amount              int64
	}{
		{"15% available is 85% used", 1000, 150, 85, 80, 85, true, false, 50},
		{"15.1% available rounds up to 85% used", 1000, 151, 85, 80, 85, true, false, 49},
		{"15.9% available still 85% used", 1000, 159, 85, 80, 85, true, false, 41},
		{"16% available is 84% used", 1000, 160, 85, 80, 84, false, false, 0},
		{"full disk", 1000, 0, 85, 80, 100, true, false, 200},
		{"empty disk", 1000, 1000, 85, 80, 0, false, false, 0},
		{"available above capacity is clamped", 1000, 2000, 85, 80, 0, false, false, 0},
		{"amount to free is floored", 999, 100, 85, 80, 90, true, false, 99}, // 999*20/100 = 199.8
		{"high 100 disables threshold gc even when full", 1000, 0, 100, 80, 100, false, false, 0},
		{"high 0 always triggers", 1000, 500, 0, 0, 50, true, false, 500},
		{"equal thresholds free to the threshold", 1000, 150, 85, 85, 85, true, false, 0},
		{"capacity 0 is invalid", 0, 0, 85, 80, 0, false, true, 0},
		{"capacity 0 with bytes available is invalid", 0, 10, 85, 80, 0, false, true, 0},
		{"no overflow on huge filesystems", 1 << 62, 1 << 60, 70, 60, 75, true, false, 691752902764108185},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			disk := DiskStats{CapacityBytes: tt.capacity, AvailableBytes: tt.available}
			p := ImagePolicy{HighThresholdPercent: tt.high, LowThresholdPercent: tt.low}
			plan := PlanImages([]*projection.State{projection.New()}, disk, p, t0)
			if plan.Usage != tt.usage || plan.Triggered != tt.triggered || plan.AmountToFree != tt.amount || plan.InvalidCapacity != tt.invalid {
				t.Fatalf("usage %d triggered %v amount %d invalid %v, want %d %v %d %v",
					plan.Usage, plan.Triggered, plan.AmountToFree, plan.InvalidCapacity, tt.usage, tt.triggered, tt.amount, tt.invalid)
			}
			if plan.Disk != disk {
				t.Errorf("plan.Disk = %+v, want the input %+v", plan.Disk, disk)
			}
		})
	}
}

func TestPlanImages(t *testing.T) {
	// pressure needs 100 bytes freed with the default 85/80 thresholds; calm needs none.
	pressure := DiskStats{CapacityBytes: 1000, AvailableBytes: 100}
	calm := DiskStats{CapacityBytes: 1000, AvailableBytes: 900}
	pinned := projection.LabelPinned + "=" + projection.LabelPinnedValue
	tests := []struct {
		name   string
		evs    []events.Event
		disk   DiskStats
		mod    func(*ImagePolicy) // applied to 85/80, no ages
		now    time.Duration      // since t0; 10h when zero
		delete []string           // "digest reason", in plan order
		keep   []string
		check  func(*testing.T, ImagePlan)
	}{
		{
			name: "least recently used first, ties by first seen then digest",
			evs: flat(
				pull(0, "d:1", "sha256:d", 10), pull(0, "a:1", "sha256:a", 10), // never used
				pull(m, "b:1", "sha256:b", 10), pull(0, "c:1", "sha256:c", 10), // both last used at 1h
				native(5*m, "x", "b:1"), remove(h, "x"),
				native(5*m, "y", "c:1"), remove(h, "y"),
				pull(0, "e:1", "sha256:e", 10), native(5*m, "z", "e:1"), remove(2*h, "z"),
			),
			disk:   pressure,
			delete: []string{"sha256:a space", "sha256:d space", "sha256:c space", "sha256:b space", "sha256:e space"},
			check: func(t *testing.T, p ImagePlan) {
				if got := p.Delete[2].LastUsed; !got.Equal(at(h)) {
					t.Errorf("last used = %v, want the removal of the last user at %v", got, at(h))
				}
			},
		},
		{
			name:   "space stops once the amount to free is reached",
			evs:    flat(pull(0, "a:1", "sha256:a", 60), pull(m, "b:1", "sha256:b", 50), pull(2*m, "c:1", "sha256:c", 10)),
			disk:   pressure,
			delete: []string{"sha256:a space", "sha256:b space"},
			keep:   []string{"sha256:c not-needed"},
			check: func(t *testing.T, p ImagePlan) {
				if p.EstimatedBytes != 110 || p.AmountToFree != 100 {
					t.Errorf("estimated %d of %d, want 110 of 100", p.EstimatedBytes, p.AmountToFree)
				}
			},
		},
		{
			name:   "not triggered: nothing goes for space",
			evs:    flat(pull(0, "a:1", "sha256:a", 60)),
			disk:   calm,
			keep:   []string{"sha256:a not-needed"},
			delete: nil,
		},
		{
			name:   "not enough to free: every candidate goes and the estimate shows the shortfall",
			evs:    flat(pull(0, "a:1", "sha256:a", 30), pull(0, "b:1", "sha256:b", 30), native(m, "x", "b:1")),
			disk:   pressure,
			delete: []string{"sha256:a space"},
			keep:   []string{"sha256:b in-use"},
			check: func(t *testing.T, p ImagePlan) {
				if p.EstimatedBytes >= p.AmountToFree {
					t.Errorf("estimated %d >= amount %d", p.EstimatedBytes, p.AmountToFree)
				}
			},
		},
		{
			name:   "min age keeps a fresh pull",
			evs:    flat(pull(0, "a:1", "sha256:a", 10), pull(10*h-m, "b:1", "sha256:b", 500)),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.MinAge = 2 * m },
			delete: []string{"sha256:a space"},
			keep:   []string{"sha256:b too-young"},
			check: func(t *testing.T, p ImagePlan) {
				if got := p.Keep[0].EligibleAt; !got.Equal(at(10*h + m)) {
					t.Errorf("eligible at %v, want %v", got, at(10*h+m))
				}
				if !p.NextAgeOut.IsZero() {
					t.Errorf("next age out = %v with max age off, want zero", p.NextAgeOut)
				}
				// a frees 10 of the 100 bytes needed: b is the next chance.
				if !p.FirstEligibleAt.Equal(at(10*h + m)) {
					t.Errorf("first eligible at %v, want %v", p.FirstEligibleAt, at(10*h+m))
				}
				want := "frees an estimated 10 B of 100 B; 1 too-young (first eligible at " + at(10*h+m).UTC().Format(time.RFC3339) + ")"
				if got := p.Shortfall(); got != want {
					t.Errorf("shortfall %q, want %q", got, want)
				}
			},
		},
		{
			name:   "min age is from first seen, not from last use",
			evs:    flat(pull(0, "a:1", "sha256:a", 10), native(h, "x", "a:1"), remove(10*h-time.Second, "x")),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.MinAge = 2 * m },
			delete: []string{"sha256:a space"},
		},
		{
			name: "max age deletes idle images whatever the disk",
			evs: flat(
				pull(0, "a:1", "sha256:a", 10), native(h, "x", "a:1"), remove(8*h, "x"),
				pull(0, "b:1", "sha256:b", 10), native(h, "y", "b:1"), remove(9*h+30*m, "y"),
			),
			disk:   calm,
			mod:    func(p *ImagePolicy) { p.MinAge, p.MaxAge = 2*m, h },
			delete: []string{"sha256:a max-age"},
			keep:   []string{"sha256:b not-needed"},
			check: func(t *testing.T, p ImagePlan) {
				if want := at(10*h + 30*m + 1); !p.NextAgeOut.Equal(want) {
					t.Errorf("next age out = %v, want %v", p.NextAgeOut, want)
				}
			},
		},
		{
			name:   "max age is strict: idle for exactly max age stays",
			evs:    flat(pull(0, "a:1", "sha256:a", 10), native(m, "x", "a:1"), remove(9*h, "x")),
			disk:   calm,
			mod:    func(p *ImagePolicy) { p.MaxAge = h },
			keep:   []string{"sha256:a not-needed"},
			delete: nil,
		},
		{
			name: "max age counts a never-used image from first seen (the kubelet deletes it at once)",
			evs: flat(
				pull(8*h, "old:1", "sha256:old", 10),
				pull(9*h+50*m, "prepulled:1", "sha256:prepulled", 10),
				pull(9*h+59*m, "fresh:1", "sha256:fresh", 10),
			),
			disk:   calm,
			mod:    func(p *ImagePolicy) { p.MinAge, p.MaxAge = 2*m, h },
			delete: []string{"sha256:old max-age"},
			keep:   []string{"sha256:prepulled not-needed", "sha256:fresh too-young"},
			check: func(t *testing.T, p ImagePlan) {
				if want := at(10*h + 50*m + 1); !p.NextAgeOut.Equal(want) {
					t.Errorf("next age out = %v, want %v", p.NextAgeOut, want)
				}
			},
		},
		{
			name:   "next age out of a too-young image is when max age passes",
			evs:    flat(pull(9*h+59*m, "fresh:1", "sha256:fresh", 10)),
			disk:   calm,
			mod:    func(p *ImagePolicy) { p.MinAge, p.MaxAge = 2*m, h },
			keep:   []string{"sha256:fresh too-young"},
			delete: nil,
			check: func(t *testing.T, p ImagePlan) {
				if want := at(10*h + 59*m + 1); !p.NextAgeOut.Equal(want) {
					t.Errorf("next age out = %v, want %v", p.NextAgeOut, want)
				}
			},
		},
		{
			name: "max-age images go first and their bytes count towards the amount",
			evs: flat(
				pull(9*h+30*m, "b:1", "sha256:b", 30), pull(9*h+40*m, "c:1", "sha256:c", 30),
				pull(0, "a:1", "sha256:a", 80), native(m, "x", "a:1"), remove(8*h, "x"),
			),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.MaxAge = h },
			delete: []string{"sha256:a max-age", "sha256:b space"},
			keep:   []string{"sha256:c not-needed"},
			check: func(t *testing.T, p ImagePlan) {
				if p.EstimatedBytes != 110 {
					t.Errorf("estimated %d, want 110", p.EstimatedBytes)
				}
			},
		},
		{
			name: "pinned on one of several names",
			evs: flat(
				pull(0, "registry.k8s.io/pause:3.10", "sha256:p", 10, "io.cri-containerd.image=managed"),
				pull(0, "sha256:config", "sha256:p", 10, "io.cri-containerd.image=managed", pinned),
				pull(0, "a:1", "sha256:a", 10),
			),
			disk:   pressure,
			delete: []string{"sha256:a space"},
			keep:   []string{"sha256:p pinned"},
			check: func(t *testing.T, p ImagePlan) {
				if it := p.Keep[0]; it.Name != "sha256:config" || len(it.Names) != 2 {
					t.Errorf("kept %+v, want the pinned name sha256:config among 2 names", it)
				}
			},
		},
		{
			name:   "pinned label with another value does not pin",
			evs:    flat(pull(0, "a:1", "sha256:a", 10, projection.LabelPinned+"=no")),
			disk:   pressure,
			delete: []string{"sha256:a space"},
		},
		{
			name: "sandbox image by name, on any of its names",
			evs: flat(
				pull(0, "sha256:config", "sha256:p", 10),
				pull(0, "registry.k8s.io/pause:3.10", "sha256:p", 10),
				pull(0, "registry.k8s.io/pause:3.9", "sha256:old", 10),
			),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.SandboxImages = []string{"registry.k8s.io/pause:3.10"} },
			delete: []string{"sha256:old space"},
			keep:   []string{"sha256:p sandbox-image"},
			check: func(t *testing.T, p ImagePlan) {
				if it := p.Keep[0]; it.Name != "registry.k8s.io/pause:3.10" || it.Rule != "registry.k8s.io/pause:3.10" {
					t.Errorf("kept %+v, want name and rule registry.k8s.io/pause:3.10", it)
				}
			},
		},
		{
			name: "sandbox image by digest",
			evs: flat(
				pull(0, "registry.k8s.io/pause:3.10", "sha256:p", 10),
				pull(0, "mirror/pause:3.10", "sha256:q", 10),
				pull(0, "registry.k8s.io/pause:3.9", "sha256:old", 10),
			),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.SandboxImages = []string{"registry.k8s.io/pause@sha256:p", "sha256:q"} },
			delete: []string{"sha256:old space"},
			keep:   []string{"sha256:p sandbox-image", "sha256:q sandbox-image"},
			check: func(t *testing.T, p ImagePlan) {
				if it := p.Keep[0]; it.Name != "sha256:p" || it.Rule != "registry.k8s.io/pause@sha256:p" {
					t.Errorf("kept %+v, want name sha256:p by rule registry.k8s.io/pause@sha256:p", it)
				}
			},
		},
		{
			name: "keep pattern on any name",
			evs: flat(
				pull(0, "app:1", "sha256:k", 10), pull(0, "registry.internal/ops/agent:2", "sha256:k", 10),
				pull(0, "registry.internal/ops/other:2", "sha256:o", 10),
				pull(0, "registry.internal/ops/deep/agent:2", "sha256:deep", 10),
			),
			disk:   pressure,
			mod:    func(p *ImagePolicy) { p.KeepPatterns = []string{"registry.internal/*/agent:*"} },
			delete: []string{"sha256:deep space", "sha256:o space"},
			keep:   []string{"sha256:k keep-pattern"},
			check: func(t *testing.T, p ImagePlan) {
				if it := p.Keep[0]; it.Name != "registry.internal/ops/agent:2" || it.Rule != "registry.internal/*/agent:*" {
					t.Errorf("kept %+v, want the matching name and pattern", it)
				}
			},
		},
		{
			name:   "in use by a native container (kubernetes#109936)",
			evs:    flat(pull(0, "tool:1", "sha256:t", 10), native(m, "ctr-run", "tool:1"), start(m, "ctr-run")),
			disk:   pressure,
			keep:   []string{"sha256:t in-use"},
			delete: nil,
			check: func(t *testing.T, p ImagePlan) {
				if it := p.Keep[0]; !slices.Equal(it.Users, []string{"ctr-run"}) || !it.LastUsed.Equal(p.Now) {
					t.Errorf("kept %+v, want user ctr-run and last used now", it)
				}
			},
		},
		{
			name:   "in use by an exited container",
			evs:    flat(pull(0, "job:1", "sha256:j", 10), dead(m, m, "job", "job:1")),
			disk:   pressure,
			keep:   []string{"sha256:j in-use"},
			delete: nil,
		},
		{
			name:   "in use by a created container that never started",
			evs:    flat(pull(0, "app:1", "sha256:a", 10), criContainer(m, "c1", "app:1", "u1", "app", "s1")),
			disk:   pressure,
			keep:   []string{"sha256:a in-use"},
			delete: nil,
		},
		{
			name:   "in use by a sandbox",
			evs:    flat(pull(0, "pause:3.10", "sha256:p", 10), sandbox(m, "s1", "u1"), start(m, "s1")),
			disk:   pressure,
			keep:   []string{"sha256:p in-use"},
			delete: nil,
		},
		{
			name: "reasons in precedence: in use, pinned, sandbox image, keep pattern, too young",
			evs: flat(
				pull(10*h, "keep/all:1", "sha256:1", 10, pinned), native(10*h, "x", "keep/all:1"),
				pull(10*h, "keep/pinned:1", "sha256:2", 10, pinned),
				pull(10*h, "keep/sandbox:1", "sha256:3", 10),
				pull(10*h, "keep/pattern:1", "sha256:4", 10),
				pull(10*h, "young:1", "sha256:5", 10),
			),
			disk: pressure,
			mod: func(p *ImagePolicy) {
				p.MinAge = m
				p.SandboxImages = []string{"keep/all:1", "keep/pinned:1", "keep/sandbox:1"}
				p.KeepPatterns = []string{"keep/*"}
			},
			keep: []string{
				"sha256:2 pinned", "sha256:3 sandbox-image", "sha256:4 keep-pattern", "sha256:5 too-young",
				"sha256:1 in-use",
			},
			delete: nil,
		},
		{
			// The kubelet turns image GC off only for high 100 with no max
			// age: with a max age, a full disk (usage rounds up to 100)
			// triggers space GC too.
			name: "high 100 with a max age: a full disk triggers space gc",
			evs: flat(
				pull(0, "old:1", "sha256:old", 10),
				pull(9*h+30*m, "new:1", "sha256:new", 10),
			),
			disk:   DiskStats{CapacityBytes: 1000, AvailableBytes: 9}, // under 1% free
			mod:    func(p *ImagePolicy) { p.HighThresholdPercent, p.MaxAge = 100, h },
			delete: []string{"sha256:old max-age", "sha256:new space"},
			check: func(t *testing.T, p ImagePlan) {
				if !p.Triggered || p.Usage != 100 {
					t.Errorf("triggered %v usage %d, want true 100", p.Triggered, p.Usage)
				}
			},
		},
		{
			name: "high 100 with a max age: below 100% only max age applies",
			evs: flat(
				pull(0, "old:1", "sha256:old", 10),
				pull(9*h+30*m, "new:1", "sha256:new", 10),
			),
			disk:   DiskStats{CapacityBytes: 1000, AvailableBytes: 10}, // 1% free: usage 99
			mod:    func(p *ImagePolicy) { p.HighThresholdPercent, p.MaxAge = 100, h },
			delete: []string{"sha256:old max-age"},
			keep:   []string{"sha256:new not-needed"},
			check: func(t *testing.T, p ImagePlan) {
				if p.Triggered || p.Usage != 99 {
					t.Errorf("triggered %v usage %d, want false 99", p.Triggered, p.Usage)
				}
			},
		},
		{
			name:   "capacity 0: nothing for space, max age still applies",
			evs:    flat(pull(0, "old:1", "sha256:old", 10), pull(9*h+30*m, "new:1", "sha256:new", 10)),
			disk:   DiskStats{},
			mod:    func(p *ImagePolicy) { p.MaxAge = h },
			delete: []string{"sha256:old max-age"},
			keep:   []string{"sha256:new not-needed"},
			check: func(t *testing.T, p ImagePlan) {
				if !p.InvalidCapacity || p.Triggered {
					t.Errorf("invalid %v triggered %v, want true false", p.InvalidCapacity, p.Triggered)
				}
			},
		},
		{
			name: "an image whose names are all gone is not in the plan",
			evs:  flat(pull(0, "a:1", "sha256:a", 10), events.ImageDeleted{At: at(m), Name: "a:1"}),
			disk: pressure,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80}
			if tt.mod != nil {
				tt.mod(&p)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("test policy: %v", err)
			}
			now := at(cmp.Or(tt.now, 10*h))
			s := build(tt.evs...)
			before := s.Clone()
			plan := PlanImages([]*projection.State{s}, tt.disk, p, now)

			if got := imageSummary(plan.Delete); !slices.Equal(got, tt.delete) {
				t.Errorf("delete:\n got %q\nwant %q", got, tt.delete)
			}
			if got := imageSummary(plan.Keep); !slices.Equal(got, tt.keep) {
				t.Errorf("keep:\n got %q\nwant %q", got, tt.keep)
			}
			checkImagePlan(t, s, plan)
			checkReclaimable(t, s, p, now)
			if !sameJSON(t, before, s) {
				t.Error("PlanImages modified the state")
			}
			if tt.check != nil {
				tt.check(t, plan)
			}
		})
	}
}

// checkImagePlan asserts what holds for every plan: each image appears once,
// deletes carry delete reasons and keeps keep reasons, no protected image is
// deleted, the estimate adds up, NextAgeOut is in the future.
func checkImagePlan(t *testing.T, s *projection.State, plan ImagePlan) {
	t.Helper()
	seen := map[string]int{}
	var sum int64
	for _, it := range plan.Delete {
		seen[it.Digest]++
		sum += it.Size
		if it.Reason != ReasonMaxAge && it.Reason != ReasonSpace {
			t.Errorf("delete %s with keep reason %q", it.Digest, it.Reason)
		}
		if s.InUse(it.Digest) || s.Images[it.Digest].Pinned() {
			t.Errorf("delete %s: in use or pinned", it.Digest)
		}
	}
	for _, it := range plan.Keep {
		seen[it.Digest]++
		if it.Reason == ReasonMaxAge || it.Reason == ReasonSpace || it.Reason == "" {
			t.Errorf("keep %s with reason %q", it.Digest, it.Reason)
		}
	}
	for d := range s.Images {
		if seen[d] != 1 {
			t.Errorf("image %s appears %d times in the plan, want 1", d, seen[d])
		}
	}
	if len(seen) != len(s.Images) {
		t.Errorf("plan has %d images, state %d", len(seen), len(s.Images))
	}
	if sum != plan.EstimatedBytes {
		t.Errorf("estimated bytes %d, sum of deletes %d", plan.EstimatedBytes, sum)
	}
	if !plan.NextAgeOut.IsZero() && !plan.NextAgeOut.After(plan.Now) {
		t.Errorf("next age out %v is not after now %v", plan.NextAgeOut, plan.Now)
	}
	if plan.Delete == nil || plan.Keep == nil {
		t.Error("nil lists: JSON would say null, not []")
	}
}

func imageSummary(items []ImageItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Digest+" "+string(it.Reason))
	}
	return out
}

// TestReclaimableBytesAllocatesNothing: the gauge every scrape and heartbeat
// asks for leaves no garbage (keep patterns aside: they parse names).
func TestReclaimableBytesAllocatesNothing(t *testing.T) {
	states := []*projection.State{busyImages(100)}
	p := ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute,
		SandboxImages: []string{"registry.test/app-1:1", "registry.test/app@sha256:" + fmt.Sprintf("%064x", 3)}}
	now := at(10 * time.Hour)
	if got, want := ReclaimableBytes(states, p, now), reclaimableByPlan(states, p, now); got == 0 || got != want {
		t.Fatalf("ReclaimableBytes = %d, want %d and not 0", got, want)
	}
	if n := testing.AllocsPerRun(10, func() { ReclaimableBytes(states, p, now) }); n != 0 {
		t.Errorf("ReclaimableBytes allocates %v times per call, want 0", n)
	}
}

// TestFleetKeepPatterns: the fleet keep list keeps like --keep-image, and
// the rule says the fleet's list kept it.
func TestFleetKeepPatterns(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	s := projection.New()
	s.Apply(events.ImageUpserted{At: now.Add(-time.Hour), Name: "registry.example/app:7", Digest: "sha256:app", Size: 10})
	s.Apply(events.ImageUpserted{At: now.Add(-time.Hour), Name: "registry.example/other:1", Digest: "sha256:other", Size: 10})
	p := ImagePolicy{HighThresholdPercent: 1, LowThresholdPercent: 0, FleetKeep: KeepList{Input: KnownInput(now), Patterns: []string{"registry.example/app:*"}}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := PlanImages([]*projection.State{s}, DiskStats{CapacityBytes: 100, AvailableBytes: 10}, p, now)
	if len(plan.Delete) != 1 || plan.Delete[0].Digest != "sha256:other" {
		t.Fatalf("delete %+v", plan.Delete)
	}
	if len(plan.Keep) != 1 || plan.Keep[0].Reason != ReasonKeepPattern || plan.Keep[0].Rule != FleetRule("registry.example/app:*") {
		t.Fatalf("keep %+v", plan.Keep)
	}
	p.FleetKeep.Patterns = []string{"[x"}
	if err := p.Validate(); err == nil {
		t.Fatal("a malformed fleet pattern passed Validate")
	}
}
