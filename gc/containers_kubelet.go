package gc

import (
	"slices"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// DefaultKubeletStatusLag is KubeletStatusLag's default: the kubelet
// rebuilds a pod's status when it syncs the pod, on a container event and
// otherwise at its syncFrequency (default 1m), requeued with up to 50%
// jitter, so 90 s; 2 minutes covers that and the relist before it.
const DefaultKubeletStatusLag = 2 * time.Minute

// KubeletStatusSettle is how long after an attempt starts the kubelet's
// pod status may still show the attempts before it: the kubelet syncs the
// pod on the start its relist (every second) sees.
const KubeletStatusSettle = 10 * time.Second

func (p ContainerPolicy) statusLag() time.Duration {
	if p.KubeletStatusLag <= 0 {
		return DefaultKubeletStatusLag
	}
	return p.KubeletStatusLag
}

// kubeletShown keeps, of the candidates (indices into list and ctrs) the
// caps would remove, the CRI containers that the kubelet's pod status may
// still show. The status names the newest attempt of each pod container
// (state) and the one before it (lastState: what `kubectl logs --previous`
// reads), as of the kubelet's last sync of the pod, which lags the
// runtime: after attempt N dies the status names N-1 as lastState until
// the kubelet syncs the pod again, up to its syncFrequency later. So, its
// unit's attempts ordered by creation, newest first:
//
//   - the newest attempt (the status's state) is left to the caps, as the
//     kubelet's own GC leaves it;
//   - any other is shown until the kubelet has moved on: the attempt after
//     its successor has started (KubeletStatusSettle ago: the sync that
//     follows a start shows the new pair; by its exit at the latest when
//     its start was not seen, startedBy), or its successor has been dead
//     (or not started) for KubeletStatusLag.
//
// A kept container stays whatever the caps (reason kubelet-may-show); the
// plan looks again when it may go (NextEligible). A deleted pod's
// containers are not candidates here: its status went with it.
func (p ContainerPolicy) kubeletShown(s *projection.State, plan *ContainerPlan, list []ContainerItem, ctrs []*projection.Container,
	candidates []int) {
	units := map[string][]*projection.Container{}
	var capped []int
	for _, i := range candidates {
		if r := list[i].Reason; (r == ReasonPerUnitCap || r == ReasonGlobalCap) && ctrs[i].CRIKind == projection.KindContainer && ctrs[i].PodUID != "" {
			capped = append(capped, i)
			units[list[i].EvictUnit] = nil
		}
	}
	if len(capped) == 0 {
		return
	}
	for _, c := range s.Containers {
		if c.CRIKind != projection.KindContainer {
			continue
		}
		if u, ok := units[c.EvictUnit()]; ok {
			units[c.EvictUnit()] = append(u, c)
		}
	}
	for _, u := range units {
		slices.SortFunc(u, func(a, b *projection.Container) int { return ageOf(b).compare(ageOf(a)) }) // newest first
	}
	for _, i := range capped {
		u := units[list[i].EvictUnit]
		at, shown := p.shownUntil(u, slices.Index(u, ctrs[i]))
		switch {
		case !shown:
		case at.IsZero() || plan.Now.Before(at):
			list[i].Reason, list[i].EligibleAt = ReasonKubeletShown, at
			if !at.IsZero() {
				earliest(&plan.NextEligible, at)
			}
		default:
			list[i].EligibleAt = at // removable since the kubelet moved on
		}
	}
}

// shownUntil says whether attempts[k] (newest first) is an older attempt
// the kubelet's status may show as lastState, and from when it no longer
// may (zero: not while its successor runs).
func (p ContainerPolicy) shownUntil(attempts []*projection.Container, k int) (until time.Time, shown bool) {
	if k < 1 {
		// The newest attempt (the pod's state) is the caps' to decide: the
		// kubelet's own GC removes it too when its caps say so.
		return time.Time{}, false
	}
	var by []time.Time
	if next := attempts[k-1]; next.State != projection.StateRunning {
		// Dead (or never started): the status names this one until the
		// kubelet syncs after that.
		by = append(by, deadSince(next).Add(p.statusLag()))
	}
	if k >= 2 {
		if started, ok := startedBy(attempts[k-2]); ok {
			by = append(by, started.Add(KubeletStatusSettle))
		}
	}
	if len(by) == 0 {
		return time.Time{}, true // its successor runs: this is its lastState
	}
	return slices.MinFunc(by, time.Time.Compare), true
}

// startedBy is the latest instant c can have started at, and false if it
// never started: its start as the projection saw it, else, for one that
// exited, its exit. The projection holds no start for an attempt whose
// /tasks/start came after its /tasks/exit (containerd 1.6 may send them
// so for a process that exits at once, as a crash loop's do: the late
// start is dropped as the run already seen exiting) or that was listed
// already exited; it ran all the same, and the kubelet's sync after its
// start has shown it.
func startedBy(c *projection.Container) (time.Time, bool) {
	if t := c.StartedAt.Time(); !t.IsZero() {
		return t, true
	}
	if c.State == projection.StateExited {
		return deadSince(c), true
	}
	return time.Time{}, false
}
