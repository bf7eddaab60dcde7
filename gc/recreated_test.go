package gc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// plainPolicy removes a plain container once its owner is done (TTL 0).
var plainPolicy = ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneNative}

// TestRelistTellsAContainerMadeAgainUnderItsID: a plain container "build"
// ran and exited, its client collected it; while the agent was away (a
// restart, containerd restarting), the client deleted it and created
// another "build", not started yet (ctr c create; a ctr run between its
// create and its task). The relist must not take the new one for the
// dead one: it has another creation time, and it never ran.
func TestRelistTellsAContainerMadeAgainUnderItsID(t *testing.T) {
	const ms = time.Millisecond
	first := events.ContainerUpserted{At: at(5 * ms), ID: "build", Image: "img", Created: at(0)}
	s := build(first, events.TaskStarted{At: at(10 * ms), ContainerID: "build", Pid: 7},
		events.TaskExited{At: at(time.Second), ContainerID: "build", ExitedAt: at(time.Second), Pid: 7, Collected: true},
		events.Synced{At: at(2 * time.Second)})
	again := events.ContainerUpserted{ID: "build", Image: "img", Created: at(time.Minute)}
	for _, ev := range projection.Reconcile(s, events.Listing{At: at(2 * time.Minute), Containers: []events.ContainerUpserted{again}}) {
		s.Apply(ev)
	}
	plan := PlanContainers(s, plainPolicy, at(3*time.Minute))
	if i := slices.IndexFunc(plan.Remove, func(it ContainerItem) bool { return it.ID == "build" }); i >= 0 {
		t.Errorf("the container made again under the dead one's id, never started, is planned for removal: %+v", plan.Remove[i])
	}
	if c := s.Containers["build"]; c == nil || c.State != projection.StateCreated {
		t.Errorf("the relisted container: %+v, want created (never started)", c)
	}
}

// TestRelistKeepsAContainerItCannotTellFromAnother: the agent's clock is
// behind containerd's (a wall-clock step forward it absorbed): its record
// of the dead "build" holds the time it first saw it, not containerd's,
// and so does the listing. The relist cannot tell it from another one
// made under its id and keeps it as it was: dead, and removed.
func TestRelistKeepsAContainerItCannotTellFromAnother(t *testing.T) {
	const ms = time.Millisecond
	// containerd stamped it an hour ahead of the agent's receipt.
	s := build(events.ContainerUpserted{At: at(5 * ms), ID: "build", Image: "img", Created: at(5 * ms)},
		events.TaskStarted{At: at(10 * ms), ContainerID: "build", Pid: 7},
		events.TaskExited{At: at(time.Second), ContainerID: "build", ExitedAt: at(time.Second), Pid: 7, Collected: true},
		events.Synced{At: at(2 * time.Second)})
	listed := events.ContainerUpserted{ID: "build", Image: "img", Created: at(2 * time.Minute)} // bounded by the listing's time
	for _, ev := range projection.Reconcile(s, events.Listing{At: at(2 * time.Minute), Containers: []events.ContainerUpserted{listed}}) {
		s.Apply(ev)
	}
	if c := s.Containers["build"]; c == nil || c.State != projection.StateExited {
		t.Fatalf("the relisted container: %+v, want it exited as it was", c)
	}
	plan := PlanContainers(s, plainPolicy, at(3*time.Minute))
	if !slices.ContainsFunc(plan.Remove, func(it ContainerItem) bool { return it.ID == "build" }) {
		t.Errorf("the dead container is no longer removed: %+v", plan)
	}
}

// recreatedRuntime is fakeContainerRuntime where the container the plan
// saw dead was deleted by its client and made again under its id just
// before the re-check: no task yet, another creation time.
type recreatedRuntime struct {
	*fakeContainerRuntime
	created map[string]time.Time
}

func (r *recreatedRuntime) ContainerCreated(_ context.Context, _, id string) (time.Time, error) {
	return r.created[id], nil
}

// TestExecutorTellsAContainerMadeAgainUnderItsID: the plan removes the
// dead "build"; before the executor's re-check its client deleted it and
// made another "build" (created, no task: ctr run between its create and
// its task). The re-check finds a container without a task, which it
// takes for the dead one: the executor must not delete the new one.
func TestExecutorTellsAContainerMadeAgainUnderItsID(t *testing.T) {
	const ms = time.Millisecond
	s := build(events.ContainerUpserted{At: at(5 * ms), ID: "build", Image: "img", Created: at(0)},
		events.TaskStarted{At: at(10 * ms), ContainerID: "build", Pid: 7},
		events.TaskExited{At: at(time.Second), ContainerID: "build", ExitedAt: at(time.Second), Pid: 7, Collected: true})
	plan := PlanContainers(s, plainPolicy, at(time.Minute))
	if len(plan.Remove) != 1 {
		t.Fatalf("plan removes %+v, want build", plan.Remove)
	}
	for created, want := range map[time.Time]string{at(time.Minute): "", at(0): "delete-native build"} {
		rt := &recreatedRuntime{fakeContainerRuntime: newFakeContainerRuntime(), created: map[string]time.Time{"build": created}}
		e := mustExecutor(t, ContainerExecutorDeps{Runtime: rt, Deletes: testDeletes1(t, &fakePublisher{}, rt)}, ContainerExecutorOptions{})
		res, err := e.Apply(context.Background(), plan, plainPolicy)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(rt.Deletes(), ","); got != want {
			t.Errorf("the container there created at %s (the plan's: %s): deletes %q, want %q (%+v)", created, at(0), got, want, res)
		}
	}
}
