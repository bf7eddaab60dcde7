package gc

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// PruneMode says which dead containers the agent may remove.
type PruneMode string

// Prune modes.
const (
	PruneNative PruneMode = "native" // only containers without io.cri-containerd.kind
	PruneAll    PruneMode = "all"    // also CRI containers and sandboxes, through the CRI API
	PruneOff    PruneMode = "off"    // none
)

// ContainerPolicy says which dead containers may go; PlanContainers expects
// one that passed Validate.
type ContainerPolicy struct {
	// MinAge protects a dead container for this long after its task exited.
	MinAge time.Duration
	// MaxPerEvictUnit is how many dead containers each evict unit keeps,
	// newest first; -1 = no limit.
	MaxPerEvictUnit int
	// MaxContainers is how many dead containers are kept in all; -1 = no limit.
	MaxContainers int
	// Prune selects which containers may be removed at all.
	Prune PruneMode
	// UncollectedGrace is how long a plain container's exited task waits
	// for its client to collect the exit status (delete the task) before
	// the agent counts the owner as done. Default (zero) 10s.
	UncollectedGrace time.Duration
	// PodGrace is how long a pod must have been gone (no sandbox of it
	// ready, its pod log dir gone) before it counts as deleted, and every
	// dead container and exited sandbox of it goes whatever the caps: the
	// kubelet's rule for deleted pods. The agent's --pod-log-grace.
	// Default 0.
	PodGrace time.Duration
	// NeverStartedGrace is how long after its creation a CRI container that
	// was never started (its start failed) waits before it counts as dead,
	// MinAge included: the kubelet starts a container right after it
	// creates it, and one created a moment ago is about to start. Default
	// (zero) 1m; tests that compare with the kubelet set 1ns.
	NeverStartedGrace time.Duration
	// KubeletStatusLag is how long the kubelet's pod status may still
	// name a pod container's previous attempt after its successor died
	// (KubeletShown): the agent's --kubelet-status-lag. Default (zero)
	// DefaultKubeletStatusLag.
	KubeletStatusLag time.Duration
	// KubeletViewOff drops the KubeletShown rule: only for the
	// differential against the kubelet's container GC (kubeletdiff/),
	// which compares the rest; the agent never sets it.
	KubeletViewOff bool
}

// PodRecheck is how often a sandbox kept only because its pod's log dir
// exists is looked at again: the kubelet removes that dir without any
// containerd event.
const PodRecheck = 5 * time.Second

// DefaultUncollectedGrace is UncollectedGrace's default.
const DefaultUncollectedGrace = 10 * time.Second

// OwnerQuiet is how long after a client's last operation on a plain
// container (create, task start, task delete) the agent leaves it alone: a
// client such as `ctr run --rm` deletes the container right after it
// collects the exit status.
const OwnerQuiet = time.Second

// DefaultNeverStartedGrace is NeverStartedGrace's default.
const DefaultNeverStartedGrace = time.Minute

func (p ContainerPolicy) startGrace() time.Duration {
	if p.NeverStartedGrace <= 0 {
		return DefaultNeverStartedGrace
	}
	return p.NeverStartedGrace
}

func (p ContainerPolicy) grace() time.Duration {
	if p.UncollectedGrace <= 0 {
		return DefaultUncollectedGrace
	}
	return p.UncollectedGrace
}

// Validate reports the first invalid field: a negative MinAge, a cap below
// -1, or an unknown prune mode.
func (p ContainerPolicy) Validate() error {
	switch {
	case p.MinAge < 0:
		return fmt.Errorf("minimum container age %s: must not be negative", p.MinAge)
	case p.MaxPerEvictUnit < -1:
		return fmt.Errorf("maximum dead containers per container %d: must be -1 (no limit) or more", p.MaxPerEvictUnit)
	case p.MaxContainers < -1:
		return fmt.Errorf("maximum dead containers %d: must be -1 (no limit) or more", p.MaxContainers)
	case p.Prune != PruneNative && p.Prune != PruneAll && p.Prune != PruneOff:
		return fmt.Errorf("prune mode %q: must be native, all or off", p.Prune)
	case p.UncollectedGrace < 0:
		return fmt.Errorf("uncollected exit grace %s: must not be negative", p.UncollectedGrace)
	case p.PodGrace < 0:
		return fmt.Errorf("pod grace %s: must not be negative", p.PodGrace)
	case p.NeverStartedGrace < 0:
		return fmt.Errorf("never-started grace %s: must not be negative", p.NeverStartedGrace)
	case p.KubeletStatusLag < 0:
		return fmt.Errorf("kubelet status lag %s: must not be negative", p.KubeletStatusLag)
	}
	return nil
}

// ContainerPlan lists every container of the state exactly once, to remove
// or to keep, with the reason.
type ContainerPlan struct {
	Now time.Time `json:"now"`
	// NextEligible is the earliest future instant at which a dead container
	// kept as too young passes MinAge; zero if none.
	NextEligible time.Time `json:"nextEligible,omitzero"`
	// PodLogDir is the state of the pod log dir, the deleted-pod sign, as
	// an input: unless it is known, no pod counted as deleted.
	PodLogDir Input `json:"podLogDir"`
	// PodSignalBlind says a pod that runs has had its pod log dir seen go:
	// the dir read is not the kubelet's, so no pod counted as deleted.
	PodSignalBlind bool `json:"podSignalBlind,omitempty"`
	// KeptUnjudged counts the containers and sandboxes kept that belong to
	// stopped pods while the pod log dir is not known or blind: the pod
	// may be deleted (its dead containers would all go), and nothing can
	// tell (fail closed, invariant 7).
	KeptUnjudged int `json:"keptUnjudged,omitempty"`
	// Remove is oldest first: containers, then sandboxes.
	Remove []ContainerItem `json:"remove"`
	// Keep is sorted by id.
	Keep []ContainerItem `json:"keep"`
}

// ContainerItem is one container (of one containerd namespace) and the
// decision about it.
type ContainerItem struct {
	Namespace     string                    `json:"namespace"`
	ID            string                    `json:"id"`
	CRIKind       string                    `json:"criKind,omitempty"`
	EvictUnit     string                    `json:"evictUnit"`
	PodUID        string                    `json:"podUID,omitempty"`
	PodName       string                    `json:"podName,omitempty"`
	PodNamespace  string                    `json:"podNamespace,omitempty"`
	ContainerName string                    `json:"containerName,omitempty"`
	Image         string                    `json:"image,omitempty"`
	State         projection.ContainerState `json:"state"`
	ExitedAt      time.Time                 `json:"exitedAt,omitzero"`
	Reason        Reason                    `json:"reason"`
	// EligibleAt is when a waiting container (too young, awaiting
	// collection, owner active, kubelet-may-show) becomes removable; for a
	// plain container to remove, when it became removable (owner done +
	// MinAge); for a CRI container to remove that the kubelet's status
	// showed, when the kubelet moved on.
	EligibleAt time.Time `json:"eligibleAt,omitzero"`
	// Containers are what keeps a sandbox (pod-has-containers).
	Containers []string `json:"containers,omitempty"`
	// Logs are, in a plan shown to an operator (ShowContainerLogs), the
	// log files and link a CRI container's removal removes with it.
	Logs *ContainerLogs `json:"logs,omitempty"`
	// created is the container's creation time as containerd stamped it,
	// when the projection holds it so (not bounded by the agent's time of
	// receipt); zero when it does not: the executor tells by it the
	// container planned from another made under its id since.
	created time.Time
}

// PlanContainers decides which dead containers to remove, with the kubelet's
// container GC semantics (pkg/kubelet/kuberuntime/kuberuntime_gc.go): dead
// means the task exited, or, for a CRI container, that it was created and
// never started (its start failed) at least NeverStartedGrace ago; the dead
// containers of a deleted pod all go; each other evict unit keeps its newest
// MaxPerEvictUnit; then, over MaxContainers, each unit keeps
// MaxContainers/units (at least 1) and the oldest go until MaxContainers
// remain. Containers younger than MinAge neither go nor count towards the
// caps. MinAge counts from the exit, which the agent observes exactly:
// stricter than the kubelet's count from creation, and never earlier. Age
// order (which go first) is the kubelet's, by creation: with fewer
// candidates than the kubelet (MinAge from the exit), the plan then never
// removes a container the kubelet would keep.
//
// Under PruneAll an exited sandbox goes when no container that stays after
// this plan is in it, and it is not the newest sandbox of a pod that is
// still there; a deleted pod's exited sandboxes all go. Neither caps nor
// MinAge apply to sandboxes (as in the kubelet). A pod is deleted when no
// sandbox of it is ready, nothing of it runs, and its pod log dir, a known
// input (PodLogDir), was seen and went PodGrace ago, counted from the later
// of that and its last sandbox's exit. It does no I/O and does not modify
// s.
//
// Plain containers (no CRI kind) have no restarts, so no per-unit cap: one
// goes once its owner is done with it and MinAge has passed since. The owner
// is done when it deleted the task (it read the exit status) or, if nobody
// does, UncollectedGrace after the exit; and never within OwnerQuiet of a
// client's last operation on it. One whose restart policy wants it running
// is not dead.
func PlanContainers(s *projection.State, p ContainerPolicy, now time.Time) ContainerPlan {
	return PlanContainersWith(s, p, now, nil)
}

// PlanContainersWith is PlanContainers reading the pod log dir (nil: not
// read, no pod counts as deleted).
func PlanContainersWith(s *projection.State, p ContainerPolicy, now time.Time, dir PodLogDir) ContainerPlan {
	return planContainers(s, p, now, dir, true)
}

// PodLogDir is the pod log dir as a container plan reads it: the kubelet
// makes a pod's log dir before its sandbox and removes it only once the
// pod is deleted, so a dir the agent saw and then saw go is the pod's
// deletion (logs.PodDirs). Absence alone is no sign: a dir that is not the
// kubelet's holds no pod dir.
type PodLogDir interface {
	// Input is the state of the dir as an input at now: unless it is
	// known, no pod counts as deleted.
	Input(now time.Time) Input
	// Gone reports whether the log dir of the pod (uid, namespace, name)
	// was seen and then went, and since when; false while it is there or
	// was never seen.
	Gone(uid, namespace, name string) (since time.Time, gone bool)
}

// PodLogDirView is a PodLogDir made of its parts (for tools and tests):
// In is its state, GoneFn says which pods' dirs were seen and went (nil:
// none).
type PodLogDirView struct {
	In     Input
	GoneFn func(uid, namespace, name string) (since time.Time, gone bool)
}

// Input returns v.In.
func (v PodLogDirView) Input(time.Time) Input { return v.In }

// Gone asks v.GoneFn.
func (v PodLogDirView) Gone(uid, namespace, name string) (time.Time, bool) {
	if v.GoneFn == nil {
		return time.Time{}, false
	}
	return v.GoneFn(uid, namespace, name)
}

// planContainers plans; without all, Keep leaves out the containers that
// are plainly not dead (running, never started) or that the prune mode
// excludes, which on a busy node are nearly all: a GC pass then looks at
// the dead containers only (State.DeadContainers; every container under
// PruneAll, whose never-started CRI containers may be dead), and gives each
// an item only when the prune mode may remove it. Remove and NextEligible
// are the same either way.
func planContainers(s *projection.State, p ContainerPolicy, now time.Time, dir PodLogDir, all bool) ContainerPlan {
	plan := ContainerPlan{Now: now}
	if dir != nil {
		plan.PodLogDir = dir.Input(now)
	}
	// Items live in one slice beside their containers and are reached by
	// index: no map and no allocation per container.
	size := len(s.Containers)
	if !all {
		size = 0 // most are settled: grow with the rest
	}
	list := make([]ContainerItem, 0, size)
	ctrs := make([]*projection.Container, 0, size) // ctrs[i] is list[i]'s
	ages := make([]ageKey, 0, size)                // ctrs[i]'s
	var sandboxes, candidates []int
	// A pass looks only at the dead: the rest are settled (running, never
	// started), and a busy node has thousands of them.
	each := s.DeadContainers
	if all || p.Prune == PruneAll {
		each = func(f func(*projection.Container) bool) {
			for _, c := range s.Containers {
				if !f(c) {
					return
				}
			}
		}
	}
	each(func(c *projection.Container) bool {
		if !all && p.settled(c) {
			return true
		}
		i := len(list)
		list, ctrs, ages = append(list, ContainerItem{}), append(ctrs, c), append(ages, ageOf(c))
		p.screen(&list[i], c, now)
		it := &list[i]
		it.Namespace = s.Namespace
		switch {
		case waiting(it.Reason):
			earliest(&plan.NextEligible, it.EligibleAt)
		case it.Reason != "":
			// kept whatever the caps, or (plain) removed whatever the caps
		case c.CRIKind == projection.KindSandbox:
			sandboxes = append(sandboxes, i)
		default:
			candidates = append(candidates, i)
		}
		return true
	})
	var pods map[string]*podFacts
	if p.Prune == PruneAll {
		pods = p.podsOf(s, &plan, list, ctrs, candidates, sandboxes, dir)
	}
	// The dead containers of a deleted pod all go; the rest fall in units.
	var units [][]int          // indexes into list, by evict unit
	unitOf := map[string]int{} // evict unit -> its index in units
	for _, i := range candidates {
		if pd := pods[ctrs[i].PodUID]; pd != nil && pd.deleted {
			list[i].Reason = ReasonPodDeleted
			continue
		}
		u, ok := unitOf[list[i].EvictUnit]
		if !ok {
			u = len(units)
			unitOf[list[i].EvictUnit] = u
			units = append(units, nil)
		}
		units[u] = append(units[u], i)
	}
	oldestFirst := func(a, b int) int { return ages[a].compare(ages[b]) }
	newestFirst := func(a, b int) int { return oldestFirst(b, a) }
	for _, u := range units {
		slices.SortFunc(u, newestFirst)
	}
	if p.MaxPerEvictUnit >= 0 {
		capUnits(units, p.MaxPerEvictUnit, ReasonPerUnitCap, list)
	}
	if p.MaxContainers >= 0 && count(units) > p.MaxContainers {
		capUnits(units, max(p.MaxContainers/len(units), 1), ReasonGlobalCap, list)
		if count(units) > p.MaxContainers {
			all := slices.Concat(units...)
			slices.SortFunc(all, newestFirst)
			for _, i := range all[p.MaxContainers:] {
				list[i].Reason = ReasonGlobalCap
			}
		}
	}
	for _, u := range units {
		for _, i := range u {
			if list[i].Reason == "" {
				list[i].Reason = ReasonWithinCap
			}
		}
	}
	if p.Prune == PruneAll && !p.KubeletViewOff {
		p.kubeletShown(s, &plan, list, ctrs, candidates)
	}
	if len(sandboxes) > 0 {
		var settled []*projection.Container // kept, without an item
		for _, c := range s.Containers {
			if !all && p.settled(c) {
				settled = append(settled, c)
			}
		}
		planSandboxes(list, ctrs, settled, sandboxes, pods)
	}

	var remove, removeSandboxes, keep []int
	for i := range list {
		switch {
		case !removes(list[i].Reason):
			keep = append(keep, i)
		case ctrs[i].CRIKind == projection.KindSandbox:
			removeSandboxes = append(removeSandboxes, i) // after the containers
		default:
			remove = append(remove, i)
		}
	}
	slices.SortFunc(keep, func(a, b int) int { return strings.Compare(list[a].ID, list[b].ID) })
	slices.SortFunc(remove, oldestFirst)
	slices.SortFunc(removeSandboxes, oldestFirst)
	remove = append(remove, removeSandboxes...)
	permute(list, slices.Concat(remove, keep))
	plan.Remove, plan.Keep = list[:len(remove):len(remove)], list[len(remove):]
	for i := range plan.Keep {
		if pd := pods[plan.Keep[i].PodUID]; pd != nil && pd.unjudged && plan.Keep[i].State != projection.StateRunning {
			plan.KeptUnjudged++
		}
	}
	return plan
}

// permute reorders list in place so that it holds, at i, what was at
// order[i] (a permutation of its indices, which it consumes): a plan's
// items are large and a full plan has tens of thousands, so they are not
// copied into a second slice.
func permute(list []ContainerItem, order []int) {
	for i := range order {
		if order[i] < 0 {
			continue // placed by an earlier cycle
		}
		tmp, j := list[i], i
		for {
			k := order[j]
			order[j] = -1
			if k == i {
				list[j] = tmp
				break
			}
			list[j], j = list[k], k
		}
	}
}

// PlanContainersAcross plans each namespace's state on its own, with the
// same rules, and joins the plans (for tools that show them all).
func PlanContainersAcross(states []*projection.State, p ContainerPolicy, now time.Time, dir PodLogDir) ContainerPlan {
	plan := ContainerPlan{Now: now, Remove: []ContainerItem{}, Keep: []ContainerItem{}}
	if dir != nil {
		plan.PodLogDir = dir.Input(now)
	}
	for _, s := range states {
		plan.merge(PlanContainersWith(s, p, now, dir))
	}
	return plan
}

// merge adds q, a plan of another namespace made at the same time, to plan:
// each namespace is planned on its own, with the same rules.
func (plan *ContainerPlan) merge(q ContainerPlan) {
	if plan.Remove == nil {
		*plan = q
		return
	}
	plan.Remove = append(plan.Remove, q.Remove...)
	plan.Keep = append(plan.Keep, q.Keep...)
	earliest(&plan.NextEligible, q.NextEligible)
	plan.PodSignalBlind = plan.PodSignalBlind || q.PodSignalBlind
	plan.KeptUnjudged += q.KeptUnjudged
}

// key identifies the item's container on the node: ids are unique only
// within a namespace.
func (it ContainerItem) key() string { return scopedKey(it.Namespace, it.ID) }

// settled reports whether c is kept whatever else holds: not dead (and
// not a never-started CRI container under PruneAll), or excluded by the
// prune mode (screen's first reasons).
func (p ContainerPolicy) settled(c *projection.Container) bool {
	switch {
	case p.Prune == PruneOff, p.Prune == PruneNative && c.CRIKind != "":
		return true
	case c.Dead():
		return false
	}
	return p.Prune != PruneAll || !neverStartedCRI(c)
}

// neverStartedCRI reports whether c is a CRI container (not a sandbox)
// that was created and never started: the kubelet creates a container
// and starts it at once, so one left so is one whose start failed.
func neverStartedCRI(c *projection.Container) bool {
	return c.CRIKind == projection.KindContainer && c.State == projection.StateCreated
}

// screen describes c in *it (in place: a full plan fills tens of thousands)
// with the reason it is kept whatever the caps: running, never started,
// excluded by the prune mode, or too young; the reason is empty for a
// candidate.
func (p ContainerPolicy) screen(it *ContainerItem, c *projection.Container, now time.Time) {
	*it = ContainerItem{
		ID:            c.ID,
		CRIKind:       c.CRIKind,
		EvictUnit:     c.EvictUnit(),
		PodUID:        c.PodUID,
		PodName:       c.PodName,
		PodNamespace:  c.PodNamespace,
		ContainerName: c.ContainerName,
		Image:         c.Image,
		State:         c.State,
		ExitedAt:      c.ExitedAt.Time(),
	}
	if c.Created.Before(c.FirstSeen) {
		it.created = c.Created.Time()
	}
	switch {
	case c.State == projection.StateRunning:
		it.Reason = ReasonRunning
	case p.Prune == PruneAll && neverStartedCRI(c):
		// Dead for the kubelet once older than MinAge, from creation; here
		// never sooner than NeverStartedGrace, as it may be about to start,
		// counted also from when the agent first saw it (containerd's
		// creation time is its wall clock, which may have stepped).
		eligible := later(c.Created.Time().Add(p.MinAge), later(c.Created.Time(), c.FirstSeen.Time()).Add(p.startGrace()))
		if now.Before(eligible) {
			it.Reason, it.EligibleAt = ReasonStarting, eligible
		}
	case !c.Dead():
		it.Reason = ReasonNeverStarted
	case p.Prune == PruneOff, p.Prune == PruneNative && c.CRIKind != "":
		it.Reason = ReasonPruneMode
	case c.CRIKind == "":
		p.screenPlain(c, now, it)
	case c.CRIKind == projection.KindSandbox:
		// No MinAge for sandboxes, as in the kubelet: a live pod's newest
		// sandbox stays whatever its age, an older one is never used again.
	default:
		if eligible := deadSince(c).Add(p.MinAge); now.Before(eligible) {
			it.Reason, it.EligibleAt = ReasonTooYoung, eligible
		}
	}
}

// screenPlain decides a dead plain container: kept while a restart policy
// wants it running, while its owner may still collect it or is working on
// it, or while too young; removed (ttl-expired) after.
func (p ContainerPolicy) screenPlain(c *projection.Container, now time.Time, it *ContainerItem) {
	if c.RestartManaged {
		it.Reason = ReasonRestartManaged
		return
	}
	done, why := deadSince(c).Add(p.grace()), ReasonAwaitingCollection
	if collected := c.CollectedAt.Time(); !collected.IsZero() && collected.Before(done) {
		done, why = collected, ReasonTooYoung
	}
	eligible := done.Add(p.MinAge)
	if p.MinAge > 0 && why == ReasonAwaitingCollection && now.After(done) {
		why = ReasonTooYoung
	}
	if quiet := c.LastOpAt.Time().Add(OwnerQuiet); quiet.After(eligible) {
		eligible, why = quiet, ReasonOwnerActive
	}
	it.EligibleAt = eligible
	if now.Before(eligible) {
		it.Reason = why
		return
	}
	it.Reason = ReasonTTLExpired
}

// waiting reports whether r keeps a container only until its EligibleAt.
func waiting(r Reason) bool {
	return r == ReasonTooYoung || r == ReasonAwaitingCollection || r == ReasonOwnerActive || r == ReasonStarting
}

// capUnits keeps the newest n of each unit (sorted newest first) and marks
// the rest with r.
func capUnits(units [][]int, n int, r Reason, list []ContainerItem) {
	for key, u := range units {
		if len(u) > n {
			for _, i := range u[n:] {
				list[i].Reason = r
			}
			units[key] = u[:n]
		}
	}
}

func count(units [][]int) int {
	n := 0
	for _, u := range units {
		n += len(u)
	}
	return n
}

// removes reports whether r is a reason to remove a container.
func removes(r Reason) bool {
	return r == ReasonPerUnitCap || r == ReasonGlobalCap || r == ReasonSandboxOrphaned || r == ReasonTTLExpired ||
		r == ReasonPodDeleted
}

// byCreation orders containers by creation, then id.
func byCreation(a, b *projection.Container) int {
	if o := a.Created.Compare(b.Created); o != 0 {
		return o
	}
	return strings.Compare(a.ID, b.ID)
}

// ageKey orders dead containers oldest first: by creation (the kubelet's
// order), then exit, then id. Plans sort tens of thousands of them, so it is a compact copy of what
// a comparison reads.
type ageKey struct {
	dead, created projection.Stamp
	id            string
}

func ageOf(c *projection.Container) ageKey { return ageKey{deadStamp(c), c.Created, c.ID} }

func (a ageKey) compare(b ageKey) int {
	return cmp.Or(a.created.Compare(b.created), a.dead.Compare(b.dead), strings.Compare(a.id, b.id))
}

// deadSince is when the container's task exited. Creation bounds it from
// below, so MinAge never expires earlier than under the kubelet's rule, also
// when the exit time is unknown.
func deadSince(c *projection.Container) time.Time { return deadStamp(c).Time() }

// deadStamp is deadSince as the projection holds it (plans sort by it).
func deadStamp(c *projection.Container) projection.Stamp {
	if c.ExitedAt.After(c.Created) {
		return c.ExitedAt
	}
	return c.Created
}
