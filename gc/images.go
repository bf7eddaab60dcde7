package gc

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// DiskStats is the image filesystem as statfs reports it, in bytes.
type DiskStats struct {
	CapacityBytes  uint64 `json:"capacityBytes"`
	AvailableBytes uint64 `json:"availableBytes"`
}

// ImagePolicy says which images may go and when; PlanImages expects one that
// passed Validate.
type ImagePolicy struct {
	// HighThresholdPercent is the disk usage at which threshold GC starts;
	// 100 with no MaxAge disables image GC (the kubelet's rule); 100 with a
	// MaxAge triggers threshold GC only on a full disk (under 1% free).
	HighThresholdPercent int
	// LowThresholdPercent is the disk usage threshold GC frees down to.
	LowThresholdPercent int
	// MinAge protects an image for this long after the agent first saw it.
	MinAge time.Duration
	// MaxAge, when positive, deletes images unused for longer than this,
	// whatever the disk usage.
	MaxAge time.Duration
	// SandboxImages are never deleted. Each entry is matched against every
	// name of an image; a digest (sha256:... or name@sha256:...) also
	// matches the image's target digest.
	SandboxImages []string
	// KeepPatterns protect every image with a name a pattern covers
	// (KeepCovers: path.Match globs, where * does not cross a /, and a
	// repository pattern covers the repository's digest references).
	KeepPatterns []string
	// FleetKeep is the fleet keep list (stored in NATS, read by the agent
	// at the edge) with the state of that read. Its patterns keep like
	// KeepPatterns, with the rule FleetRule(pattern), known or stale (a
	// stale list is the last one read: all there is). While it is unknown
	// (never read), FleetKeepWait decides.
	FleetKeep KeepList
	// FleetKeepWait, when positive, is how long deletes wait for a fleet
	// keep list never read: from FleetKeep.Since (when the agent began to
	// wait; now when zero) until FleetKeep.Since+FleetKeepWait, every
	// image no other rule keeps is kept as keep-list-unread, since the
	// list could name it. After that, GC goes on without the fleet's
	// patterns (KeepPatterns only). Zero: no wait.
	FleetKeepWait time.Duration
	// Order, if set, orders the candidates of threshold GC: the lowest
	// rank goes first, ties least recently used first. nil is least
	// recently used first, the kubelet's order. Max-age candidates all go,
	// least recently used first, whatever it says.
	Order ImageOrder `json:"-"`
}

// ImageOrder ranks the candidates of threshold GC (ImagePolicy.Order). It
// must not change while PlanImages runs.
type ImageOrder interface {
	// Rank is what keeping the image is worth: the lowest goes first.
	Rank(it *ImageItem) float64
}

// KeepList is a keep list as a planner reads it: its patterns, and the
// state of the read they come from. The zero value is a list never read.
type KeepList struct {
	Input
	Patterns []string `json:"patterns"`
	// Prefixes keep every image a name of which, as stored or in its
	// familiar form, starts with one (the fleet's invalid patterns: their
	// literal text before the first glob character; "" keeps every image).
	Prefixes []string `json:"prefixes,omitempty"`
	// Declared is the cluster keep list (gcagent-cluster's): exact image
	// references (declared.Normalize's), each with the workloads that
	// declare it, matched by name (DeclaredMatch), never as globs: a
	// cluster's 20,000 references cost a lookup per name, not a match
	// each.
	Declared map[string]string `json:"-"`
}

// FleetRule is the rule of an image the fleet keep list keeps: the
// pattern, marked as the fleet's.
func FleetRule(pattern string) string { return "fleet keep list: " + pattern }

// RuleKeepListUnread is the rule of an image kept because the fleet keep
// list was never read.
const RuleKeepListUnread = "fleet keep list never read"

// KeepListWait reports whether deletes wait for the fleet keep list at
// now (it is unknown and FleetKeepWait has not passed since the wait
// began), and until when.
func (p ImagePolicy) KeepListWait(now time.Time) (until time.Time, waiting bool) {
	if p.FleetKeepWait <= 0 || p.FleetKeep.State != InputUnknown {
		return time.Time{}, false
	}
	since := p.FleetKeep.Since
	if since.IsZero() {
		since = now // a wait nobody dated starts now: it never ends by itself
	}
	until = since.Add(p.FleetKeepWait)
	return until, now.Before(until)
}

// Validate reports the first invalid field: thresholds outside 0..100, a low
// threshold above the high one, a negative age, a positive MaxAge not above
// MinAge (the kubelet's rule), or a malformed keep pattern. Equal thresholds
// are accepted, as the kubelet's image GC manager accepts them: GC then frees
// just down to the threshold, so it triggers again on the next byte written.
func (p ImagePolicy) Validate() error {
	switch {
	case p.HighThresholdPercent < 0 || p.HighThresholdPercent > 100:
		return fmt.Errorf("image gc high threshold %d%%: must be within 0..100", p.HighThresholdPercent)
	case p.LowThresholdPercent < 0 || p.LowThresholdPercent > 100:
		return fmt.Errorf("image gc low threshold %d%%: must be within 0..100", p.LowThresholdPercent)
	case p.LowThresholdPercent > p.HighThresholdPercent:
		return fmt.Errorf("image gc low threshold %d%%: must not be above the high threshold %d%%",
			p.LowThresholdPercent, p.HighThresholdPercent)
	case p.MinAge < 0:
		return fmt.Errorf("minimum image age %s: must not be negative", p.MinAge)
	case p.MaxAge < 0:
		return fmt.Errorf("maximum image age %s: must not be negative", p.MaxAge)
	case p.MaxAge > 0 && p.MaxAge <= p.MinAge:
		return fmt.Errorf("maximum image age %s: must be greater than the minimum image age %s", p.MaxAge, p.MinAge)
	case p.FleetKeepWait < 0:
		return fmt.Errorf("keep list wait %s: must not be negative", p.FleetKeepWait)
	}
	for _, pattern := range append(slices.Clone(p.KeepPatterns), p.FleetKeep.Patterns...) {
		if err := ValidKeepPattern(pattern); err != nil {
			return err
		}
	}
	return nil
}

// ImagePlan lists every image of the states exactly once, to delete or to
// keep, with the reason.
type ImagePlan struct {
	Now  time.Time `json:"now"`
	Disk DiskStats `json:"disk"`
	// InvalidCapacity says the filesystem reported capacity 0: threshold GC
	// cannot run (max-age GC still does).
	InvalidCapacity bool `json:"invalidCapacity,omitempty"`
	// Usage is the disk usage in percent, rounded up like the kubelet's.
	Usage int `json:"usage"`
	// Triggered says usage reached the high threshold.
	Triggered bool `json:"triggered"`
	// AmountToFree is the bytes threshold GC must free to reach the low
	// threshold; 0 when not triggered.
	AmountToFree int64 `json:"amountToFree"`
	// EstimatedBytes is the sum of the sizes of the images to delete. It
	// overstates what is freed when layers are shared; when it is below
	// AmountToFree, deleting every eligible image is not enough.
	EstimatedBytes int64 `json:"estimatedBytes"`
	// NextAgeOut is the earliest future instant at which a kept image
	// becomes a max-age candidate; zero when none will or MaxAge is off.
	NextAgeOut time.Time `json:"nextAgeOut,omitzero"`
	// FirstEligibleAt is, when the plan falls short of AmountToFree, the
	// earliest instant at which a too-young image passes MinAge (or the
	// wait for the fleet keep list ends): the next chance to free more.
	// Zero otherwise.
	FirstEligibleAt time.Time `json:"firstEligibleAt,omitzero"`
	// KeepListWaitUntil is, while deletes wait for a fleet keep list never
	// read, when they stop waiting (ImagePolicy.KeepListWait). Zero when
	// they do not wait.
	KeepListWaitUntil time.Time `json:"keepListWaitUntil,omitzero"`
	// Delete is in the order to delete: max-age images, then space images,
	// each least recently used first.
	Delete []ImageItem `json:"delete"`
	// Keep is least recently used first.
	Keep []ImageItem `json:"keep"`
}

// ImageItem is one image (one target digest with all its names, in one
// containerd namespace) and the decision about it.
type ImageItem struct {
	Namespace string    `json:"namespace"`
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"` // sorted
	Size      int64     `json:"size"`
	FirstSeen time.Time `json:"firstSeen"`
	// LastUsed is now while a container references the image, zero if none
	// ever did.
	LastUsed time.Time `json:"lastUsed,omitzero"`
	Reason   Reason    `json:"reason"`
	// Users are the ids of the containers using the image (in-use).
	Users []string `json:"users,omitempty"`
	// Name is the name (or digest) that matched (pinned, sandbox-image,
	// keep-pattern).
	Name string `json:"name,omitempty"`
	// Rule is the policy entry that matched: the sandbox image or the keep
	// pattern.
	Rule string `json:"rule,omitempty"`
	// EligibleAt is when a too-young image passes MinAge.
	EligibleAt time.Time `json:"eligibleAt,omitzero"`
	// ConfigDigest and ChainID say what content it is, for the re-check.
	ConfigDigest string `json:"configDigest,omitempty"`
	ChainID      string `json:"chainID,omitempty"`
}

// PlanImages decides which images to delete now, with kubelet semantics:
// threshold GC when usage reaches the high threshold, freeing down to the
// low one, least recently used first; plus max-age GC whatever the disk.
// Unlike the kubelet, max-age never deletes an image younger than MinAge and
// counts a never-used image's idle time from when it was first seen, and the
// bytes of max-age deletions count towards the amount to free.
//
// states are the projections of every managed namespace: they share one
// disk, so there is one plan, least recently used first over their union.
// Each image is judged within its own namespace (another namespace's
// containers neither hold it nor free it); the policy's rules apply to
// every image alike. It does no I/O and modifies no state.
func PlanImages(states []*projection.State, disk DiskStats, p ImagePolicy, now time.Time) ImagePlan {
	plan := ImagePlan{Now: now, Disk: disk}
	plan.measure(p)
	if until, waiting := p.KeepListWait(now); waiting {
		plan.KeepListWaitUntil = until
	}

	n := 0
	for _, s := range states {
		n += len(s.Images)
	}
	items := make([]ImageItem, 0, n)
	for _, s := range states {
		for _, img := range s.Images {
			items = append(items, p.screen(s, img, now))
		}
	}
	slices.SortFunc(items, func(a, b ImageItem) int {
		// cmp.Or evaluates every argument: the strings are compared only
		// on a tie of times.
		if o := cmp.Or(a.LastUsed.Compare(b.LastUsed), a.FirstSeen.Compare(b.FirstSeen)); o != 0 {
			return o
		}
		return cmp.Or(strings.Compare(a.Digest, b.Digest), strings.Compare(a.Namespace, b.Namespace))
	})

	// An empty reason marks a candidate: first the ones past MaxAge go,
	// then, least recently used first (or in the policy's order), as many
	// as the disk needs.
	for i, it := range items {
		if it.Reason == "" && p.MaxAge > 0 && now.Sub(idleSince(it)) > p.MaxAge {
			items[i].Reason = ReasonMaxAge
			plan.EstimatedBytes += it.Size
		}
	}
	space := p.spaceOrder(items)
	for _, i := range space {
		if plan.EstimatedBytes < plan.AmountToFree {
			items[i].Reason = ReasonSpace
			plan.EstimatedBytes += items[i].Size
		} else {
			items[i].Reason = ReasonNotNeeded
		}
	}

	// Delete and Keep share one array of exactly the items' size: a plan
	// of a busy node's images is megabytes, planned by every pass and
	// scrape, and appends would leave as much again behind.
	out := make([]ImageItem, 0, len(items))
	for _, it := range items {
		if it.Reason == ReasonMaxAge {
			out = append(out, it)
		}
	}
	for _, i := range space {
		if items[i].Reason == ReasonSpace {
			out = append(out, items[i])
		}
	}
	plan.Delete, out = out[:len(out):len(out)], out[len(out):]
	for _, it := range items {
		switch it.Reason {
		case ReasonMaxAge, ReasonSpace:
			continue
		case ReasonTooYoung, ReasonNotNeeded, ReasonKeepListUnread:
			if it.Reason != ReasonNotNeeded && plan.Triggered && plan.EstimatedBytes < plan.AmountToFree {
				earliest(&plan.FirstEligibleAt, it.EligibleAt)
			}
			if p.MaxAge > 0 {
				// Strictly older than MaxAge, like the kubelet. Idle time starts
				// no earlier than first seen and MaxAge > MinAge, so by then the
				// image is no longer too young; one the wait for the fleet keep
				// list holds ages out when the wait ends.
				earliest(&plan.NextAgeOut, later(idleSince(it).Add(p.MaxAge+time.Nanosecond), it.EligibleAt))
			}
		}
		out = append(out, it)
	}
	plan.Keep = out
	return plan
}

// spaceOrder returns the indexes of the candidates left in items (sorted
// least recently used first) in the order threshold GC takes them: as they
// are, or by the policy's Order, ties as they are.
func (p ImagePolicy) spaceOrder(items []ImageItem) []int {
	var idx []int
	for i, it := range items {
		if it.Reason == "" {
			idx = append(idx, i)
		}
	}
	if p.Order == nil {
		return idx
	}
	rank := make(map[int]float64, len(idx))
	for _, i := range idx {
		rank[i] = p.Order.Rank(&items[i])
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rank[a], rank[b]) })
	return idx
}

// Shortfall says, when the plan frees less than AmountToFree, why: how
// many images each rule keeps, and when the first too-young one becomes
// eligible. Empty when the plan is enough or GC is not triggered.
func (plan ImagePlan) Shortfall() string {
	if !plan.Triggered || plan.EstimatedBytes >= plan.AmountToFree {
		return ""
	}
	counts := map[Reason]int{}
	for _, it := range plan.Keep {
		counts[it.Reason]++
	}
	parts := []string{"frees an estimated " + HumanBytes(plan.EstimatedBytes) + " of " + HumanBytes(plan.AmountToFree)}
	for _, r := range slices.Sorted(maps.Keys(counts)) {
		part := fmt.Sprintf("%d %s", counts[r], r)
		switch {
		case r == ReasonTooYoung && !plan.FirstEligibleAt.IsZero():
			part += " (first eligible at " + plan.FirstEligibleAt.UTC().Format(time.RFC3339) + ")"
		case r == ReasonKeepListUnread:
			part += " (waiting for the fleet keep list until " + plan.KeepListWaitUntil.UTC().Format(time.RFC3339) + ")"
		}
		parts = append(parts, part)
	}
	if len(counts) == 0 {
		parts = append(parts, "no image left to delete")
	}
	return strings.Join(parts, "; ")
}

// HumanBytes writes n bytes for a person: 512 B, 1.5 KiB, 230.0 MiB, 2.1 GiB.
func HumanBytes(n int64) string {
	f := float64(n)
	for _, u := range []struct {
		name string
		size float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if math.Abs(f) >= u.size {
			return fmt.Sprintf("%.1f %s", f/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// measure sets the usage, the trigger and the amount to free with the
// kubelet's integer arithmetic, without its overflow on huge filesystems.
func (plan *ImagePlan) measure(p ImagePolicy) {
	capacity := plan.Disk.CapacityBytes
	available := min(plan.Disk.AvailableBytes, capacity)
	if capacity == 0 {
		plan.InvalidCapacity = true
		return
	}
	plan.Usage = 100 - int(mulDiv(available, 100, capacity))
	// The kubelet turns image GC off only for high 100 with no max age;
	// with a max age set, a full disk (usage rounds up to 100) triggers it.
	plan.Triggered = (p.HighThresholdPercent < 100 || p.MaxAge > 0) && plan.Usage >= p.HighThresholdPercent
	if plan.Triggered {
		plan.AmountToFree = int64(mulDiv(capacity, uint64(100-p.LowThresholdPercent), 100)) - int64(available)
	}
}

// screen describes img and gives the reason it must be kept whatever the
// disk, in the fixed precedence in-use, pinned, sandbox image, keep pattern,
// too young, keep list unread; the reason is empty for a candidate.
func (p ImagePolicy) screen(s *projection.State, img *projection.Image, now time.Time) ImageItem {
	it := ImageItem{
		Namespace: s.Namespace,
		Digest:    img.Digest,
		Names:     img.Names.Strings(),
		Size:      img.Size,
		FirstSeen: img.FirstSeen.Time(),
		LastUsed:  s.LastUsed(img, now),

		ConfigDigest: img.ConfigDigest,
		ChainID:      img.ChainID,
	}
	if users := s.ImageUsers(img); len(users) > 0 {
		it.Reason, it.Users = inUseReason(s, img, users), users
		return it
	}
	it.Reason, it.Name, it.Rule, it.EligibleAt = p.rule(img, now)
	return it
}

// rule is screen after in-use, allocating nothing (keep patterns aside,
// which parse names): why an unused image is kept (pinned, sandbox image,
// keep pattern, too young, keep list unread), the name and the policy
// entry that matched, and when a too-young image passes MinAge (or the
// wait for the fleet keep list ends); an empty reason for a candidate.
func (p ImagePolicy) rule(img *projection.Image, now time.Time) (r Reason, name, rule string, eligibleAt time.Time) {
	for _, n := range img.Names {
		if n.Labels[projection.LabelPinned] == projection.LabelPinnedValue {
			return ReasonPinned, n.Name, "", time.Time{}
		}
	}
	for _, ref := range p.SandboxImages {
		if name, ok := matchRef(ref, img); ok {
			return ReasonSandboxImage, name, ref, time.Time{}
		}
	}
	for _, pattern := range p.KeepPatterns {
		for _, n := range img.Names { // sorted, as ImageItem.Names
			if keepMatch(pattern, n.Name) {
				return ReasonKeepPattern, n.Name, pattern, time.Time{}
			}
		}
	}
	for _, pattern := range p.FleetKeep.Patterns {
		for _, n := range img.Names {
			if keepMatch(pattern, n.Name) {
				return ReasonKeepPattern, n.Name, FleetRule(pattern), time.Time{}
			}
		}
	}
	for _, prefix := range p.FleetKeep.Prefixes {
		for _, n := range img.Names {
			if PrefixKeeps(prefix, n.Name) {
				return ReasonKeepPattern, n.Name, FleetRule(prefix + "... (an invalid pattern)"), time.Time{}
			}
		}
	}
	if len(p.FleetKeep.Declared) > 0 {
		for _, n := range img.Names {
			if ref, by, ok := DeclaredMatch(p.FleetKeep.Declared, n.Name); ok {
				return ReasonKeepPattern, n.Name, DeclaredRule(ref, by), time.Time{}
			}
		}
	}
	if eligible := img.FirstSeen.Time().Add(p.MinAge); now.Before(eligible) {
		return ReasonTooYoung, "", "", eligible
	}
	if until, waiting := p.KeepListWait(now); waiting {
		return ReasonKeepListUnread, "", RuleKeepListUnread, until
	}
	return "", "", "", time.Time{}
}

// ReclaimableBytes is what image GC could delete now if the disk were full:
// the sizes of the images no rule protects, which on a full disk are the
// plan's deletions and its not-needed images. Scrapes and heartbeats ask
// for it; it builds no plan (a plan of a busy node's images is megabytes
// of garbage each time) and allocates nothing but what keep patterns take
// to normalize names.
func ReclaimableBytes(states []*projection.State, p ImagePolicy, now time.Time) (n int64) {
	for _, s := range states {
		for _, img := range s.Images {
			if r, _, _, _ := p.rule(img, now); r == "" && !s.ImageInUse(img) {
				n += img.Size
			}
		}
	}
	return n
}

// inUseReason says how the containers in users hold img, the most exact
// way first: CRI's image id of a container, a rootfs snapshot prepared from
// its top layer, an image volume, and last the target its name resolved to.
func inUseReason(s *projection.State, img *projection.Image, users []string) Reason {
	best := ReasonInUse
	rank := map[Reason]int{ReasonInUseByID: 3, ReasonInUseBySnap: 2, ReasonImageVolume: 1, ReasonInUse: 0}
	for _, id := range users {
		c := s.Containers[id]
		if c == nil {
			continue
		}
		r := ReasonInUse
		switch {
		case img.ConfigDigest != "" && c.ImageID == img.ConfigDigest:
			r = ReasonInUseByID
		case img.ChainID != "" && c.RootChain == img.ChainID:
			r = ReasonInUseBySnap
		case slices.Contains(c.VolumeImageIDs(), img.ConfigDigest) || slices.Contains(c.VolumeChains(), img.ChainID):
			r = ReasonImageVolume
		}
		if rank[r] > rank[best] {
			best = r
		}
	}
	return best
}

// matchRef reports whether ref names the image: equal to one of its names,
// or a digest (alone or after an @) equal to its target digest. It returns
// what matched.
func matchRef(ref string, img *projection.Image) (string, bool) {
	if _, ok := img.Names.Labels(ref); ok {
		return ref, true
	}
	digest := ref[strings.LastIndexByte(ref, '@')+1:]
	if digest != "" && digest == img.Digest {
		return img.Digest, true
	}
	return "", false
}

// idleSince is when the image became unused, or was first seen if it never
// was used: a freshly pulled image is not idle since the epoch.
func idleSince(it ImageItem) time.Time { return later(it.LastUsed, it.FirstSeen) }

// mulDiv returns a*b/c rounded down, exact for all inputs whose result fits
// in 64 bits.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// KeptForInputs counts the images kept now only because an input is not
// known (fail closed, invariant 7): while the fleet keep list was never
// read and deletes wait for it (keep-list-unread), and, while the list is
// stale, those its last patterns keep. Like ReclaimableBytes it builds no
// plan.
func KeptForInputs(states []*projection.State, p ImagePolicy, now time.Time) (unread, stale int) {
	for _, s := range states {
		for _, img := range s.Images {
			r, _, rule, _ := p.rule(img, now)
			switch {
			case r == ReasonKeepListUnread && !s.ImageInUse(img):
				unread++
			case r == ReasonKeepPattern && p.FleetKeep.State == InputStale && isFleetRule(rule) && !s.ImageInUse(img):
				stale++
			}
		}
	}
	return unread, stale
}

// isFleetRule reports whether a keep rule is the fleet's (FleetRule,
// DeclaredRule), not --keep-image's.
func isFleetRule(rule string) bool {
	return strings.HasPrefix(rule, FleetRule("")) || strings.HasPrefix(rule, DeclaredRule("", ""))
}
