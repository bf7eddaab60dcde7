package gc

import (
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// TestRelistKeepsTheCreationOrderOfContainersStampedAhead: the wall clock
// stepped forward while the agent ran (NTP on a VM that was paused, an
// operator): containerd's stamps are ahead of the agent's clock, so the
// Source bounds each creation time by its time of receipt (the event's,
// then each listing's). A pod's container crash-loops: attempt 1 (id
// "b-…") then attempt 2 (id "a-…"), both dead, each recorded at its
// receipt, in order. A relist bounds both by the listing's time: the same
// instant. Their creation order must survive it: the per-unit cap keeps
// the newest attempt (the kubelet's lastState, `kubectl logs --previous`)
// and removes the older one, never the other way round by id.
func TestRelistKeepsTheCreationOrderOfContainersStampedAhead(t *testing.T) {
	const s = time.Second
	// Each creation time is its receipt's: containerd's stamp, ahead, is bounded.
	evs := flat(sandbox(0, "sb", "u1"), start(0, "sb"),
		criDead(10*s, 5*s, "b-attempt1", "app:1", "u1", "app", "sb"),
		criDead(30*s, 5*s, "a-attempt2", "app:1", "u1", "app", "sb"),
		events.Synced{At: at(40 * s)})
	st := build(evs...)
	relist := at(5 * time.Minute)
	var listed []events.ContainerUpserted
	for _, e := range evs {
		if c, ok := e.(events.ContainerUpserted); ok {
			c.At, c.Created = relist, relist // containerd's stamp, still ahead: bounded by the listing's time
			listed = append(listed, c)
		}
	}
	tasks := []events.Task{{ContainerID: "sb", Pid: 1000, Status: events.TaskRunning},
		{ContainerID: "b-attempt1", Pid: 1010, Status: events.TaskStopped, ExitedAt: at(15 * s)},
		{ContainerID: "a-attempt2", Pid: 1030, Status: events.TaskStopped, ExitedAt: at(35 * s)}}
	for _, ev := range projection.Reconcile(st, events.Listing{At: relist, Containers: listed, Tasks: tasks}) {
		st.Apply(ev)
	}
	policy := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll}
	plan := PlanContainers(st, policy, at(time.Hour))
	removed := func(id string) bool {
		return slices.ContainsFunc(plan.Remove, func(it ContainerItem) bool { return it.ID == id })
	}
	if removed("a-attempt2") {
		t.Errorf("the newest attempt (the kubelet's lastState) is removed after a relist: %v", containerSummary(plan.Remove))
	}
	if !removed("b-attempt1") {
		t.Errorf("the older attempt is not removed: remove %v, keep %v", containerSummary(plan.Remove), containerSummary(plan.Keep))
	}
}

// TestRelistKeepsTheNewestSandboxOfContainersStampedAhead: as above, for
// a pod's sandboxes: the pod (not deleted) was recreated in a new sandbox
// ("a-…") after its first one ("b-…") stopped; both are now stopped (the
// node rebooting, the kubelet not yet back). The kubelet keeps the
// newest sandbox of a pod that is there; so must the plan after a relist.
func TestRelistKeepsTheNewestSandboxOfContainersStampedAhead(t *testing.T) {
	const s = time.Second
	evs := flat(sandbox(0, "b-sandbox1", "u1"), start(0, "b-sandbox1"), exit(10*s, "b-sandbox1"),
		sandbox(20*s, "a-sandbox2", "u1"), start(20*s, "a-sandbox2"), exit(30*s, "a-sandbox2"),
		events.Synced{At: at(40 * s)})
	st := build(evs...)
	relist := at(5 * time.Minute)
	var listed []events.ContainerUpserted
	for _, e := range evs {
		if c, ok := e.(events.ContainerUpserted); ok {
			c.At, c.Created = relist, relist // bounded by the listing's time
			listed = append(listed, c)
		}
	}
	tasks := []events.Task{{ContainerID: "b-sandbox1", Pid: 1000, Status: events.TaskStopped, ExitedAt: at(10 * s)},
		{ContainerID: "a-sandbox2", Pid: 1020, Status: events.TaskStopped, ExitedAt: at(30 * s)}}
	for _, ev := range projection.Reconcile(st, events.Listing{At: relist, Containers: listed, Tasks: tasks}) {
		st.Apply(ev)
	}
	plan := PlanContainers(st, ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll}, at(time.Hour))
	if slices.ContainsFunc(plan.Remove, func(it ContainerItem) bool { return it.ID == "a-sandbox2" }) {
		t.Errorf("the pod's newest sandbox is removed after a relist: remove %v, keep %v",
			containerSummary(plan.Remove), containerSummary(plan.Keep))
	}
}
