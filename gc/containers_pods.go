package gc

import (
	"slices"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// podFacts is what a plan knows of one pod (by uid) of the namespace.
type podFacts struct {
	namespace, name string
	// stopped: no sandbox of it is ready (or being made) and no container
	// of it runs.
	stopped bool
	// lastExit is when its last sandbox stopped (zero: none known).
	lastExit time.Time
	// newest is its newest sandbox, by creation, whatever its state.
	newest *projection.Container
	// deleted: stopped, and its log dir seen and gone for PodGrace.
	deleted bool
	// unjudged: stopped, while the pod log dir, the deleted-pod sign, is
	// not known (or blind): whether it is deleted cannot be told.
	unjudged bool
}

// podsOf gathers the pods of s and decides which of those with a candidate
// (indices into list and ctrs) or an exited sandbox are deleted: every
// sandbox stopped, nothing running, the pod log dir a known input, and
// the pod's dir seen there and gone since a time at least PodGrace before
// now, the grace counted from its last sandbox's exit if that is later. A
// pod that is stopped but not yet deleted makes the plan look again
// (NextEligible): when its grace ends, or, while its log dir is there or
// the dir is not known, PodRecheck from now, since the kubelet removes
// that dir without any containerd event.
func (p ContainerPolicy) podsOf(s *projection.State, plan *ContainerPlan, list []ContainerItem, ctrs []*projection.Container,
	candidates, sandboxes []int, dir PodLogDir) map[string]*podFacts {
	if len(candidates) == 0 && len(sandboxes) == 0 {
		return nil
	}
	pods := map[string]*podFacts{}
	for _, c := range s.Containers {
		if c.CRIKind == "" || c.PodUID == "" {
			continue
		}
		pd := pods[c.PodUID]
		if pd == nil {
			pd = &podFacts{stopped: true}
			pods[c.PodUID] = pd
		}
		if pd.namespace == "" || pd.name == "" {
			pd.namespace, pd.name = c.PodNamespace, c.PodName
		}
		switch c.CRIKind {
		case projection.KindSandbox:
			if c.State != projection.StateExited {
				pd.stopped = false
			}
			pd.lastExit = later(pd.lastExit, deadSince(c))
			if pd.newest == nil || byCreation(c, pd.newest) > 0 {
				pd.newest = c
			}
		case projection.KindContainer:
			if c.State == projection.StateRunning {
				pd.stopped = false
			}
		}
	}
	switch {
	case dir == nil:
		return pods
	case !plan.PodLogDir.Known():
		// Not read yet, or its reads fail: no sign of any pod.
		earliest(&plan.NextEligible, plan.Now.Add(PodRecheck))
		unjudged(pods)
		return pods
	case podSignalBlind(pods, dir):
		// A pod that runs has had its log dir go: the dir the agent reads
		// is not the kubelet's (another podLogsDir, a dir swapped), and
		// its signs are none. No pod counts as deleted.
		plan.PodSignalBlind = true
		earliest(&plan.NextEligible, plan.Now.Add(PodRecheck))
		unjudged(pods)
		return pods
	}
	decided := map[string]bool{}
	for _, i := range slices.Concat(candidates, sandboxes) {
		uid := ctrs[i].PodUID
		pd := pods[uid]
		if pd == nil || decided[uid] {
			continue
		}
		decided[uid] = true
		if !pd.stopped {
			continue
		}
		since, gone := dir.Gone(uid, pd.namespace, pd.name)
		if !gone {
			// Its log dir may go at any time, without an event.
			earliest(&plan.NextEligible, plan.Now.Add(PodRecheck))
			continue
		}
		if at := later(since, pd.lastExit).Add(p.PodGrace); plan.Now.Before(at) {
			earliest(&plan.NextEligible, at)
			continue
		}
		pd.deleted = true
	}
	return pods
}

// planSandboxes decides the exited sandboxes (indices into list and ctrs),
// as the kubelet does: a sandbox is active while a container that stays
// after this plan names it as its sandbox (settled containers have no item
// and stay); an inactive one goes unless it is the newest sandbox of a pod
// that is not deleted. A container whose sandbox the agent does not know
// keeps every sandbox of its pod. A sandbox without a pod uid is of no pod
// and goes once inactive. It is linear in the containers.
func planSandboxes(list []ContainerItem, ctrs, settled []*projection.Container, sandboxes []int, pods map[string]*podFacts) {
	// The containers that stay, threaded through next by sandbox id (or by
	// pod uid when the sandbox is not known), so the index costs no
	// allocation per container.
	all := slices.Concat(ctrs, settled)
	next := make([]int, len(all)) // index+1 of the next, 0 ends
	heads := make(map[string]int, len(sandboxes))
	for i, c := range all {
		if c.CRIKind != projection.KindContainer || i < len(list) && removes(list[i].Reason) {
			continue
		}
		key := c.SandboxID
		if key == "" {
			if c.PodUID == "" {
				continue
			}
			key = "pod:" + c.PodUID // sandbox ids are hex, never so
		}
		next[i], heads[key] = heads[key], i+1
	}
	for _, i := range sandboxes {
		sb, it := ctrs[i], &list[i]
		var ids []string
		for _, key := range []string{sb.ID, "pod:" + sb.PodUID} {
			if key == "pod:" {
				continue
			}
			for j := heads[key]; j > 0; j = next[j-1] {
				ids = append(ids, all[j-1].ID)
			}
		}
		pd := pods[sb.PodUID]
		switch {
		case len(ids) > 0:
			slices.Sort(ids)
			it.Reason, it.Containers = ReasonPodHasContainers, slices.Compact(ids)
		case sb.PodUID == "" || pd == nil:
			it.Reason = ReasonSandboxOrphaned
		case pd.deleted:
			it.Reason = ReasonPodDeleted
		case pd.newest == sb:
			it.Reason = ReasonNewestSandbox
		default:
			it.Reason = ReasonSandboxOrphaned
		}
	}
}

// podSignalBlind reports whether a pod that is not stopped (a sandbox ready
// or a container running) has had its log dir go: the kubelet removes a
// pod's log dir only once the pod is deleted, so the sign cannot be read.
func podSignalBlind(pods map[string]*podFacts, dir PodLogDir) bool {
	for uid, pd := range pods {
		if pd.stopped {
			continue
		}
		if _, gone := dir.Gone(uid, pd.namespace, pd.name); gone {
			return true
		}
	}
	return false
}

// unjudged marks the stopped pods: with no readable deleted-pod sign,
// they may be deleted, and what they hold is kept for that.
func unjudged(pods map[string]*podFacts) {
	for _, pd := range pods {
		if pd.stopped {
			pd.unjudged = true
		}
	}
}
