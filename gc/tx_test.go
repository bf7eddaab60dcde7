package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
)

// TestContainerExecutorTransactions: each delete is begun as an intent
// while the runtime still has the container, a removal is committed as its
// event, a delete that fails and did not happen is aborted, and a dry run
// begins nothing and publishes container.skipped, never container.removed
// (issue 25, finding 8).
func TestContainerExecutorTransactions(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	f.InjectError("cri-remove", "app-2", errors.New("boom"))
	pub := &fakePublisher{}
	d, j := testDeletes(t, pub, f)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: d, Publisher: pub}, ContainerExecutorOptions{Parallelism: 1, Clock: clock.System(func() time.Time { return at(time.Minute) })})
	if _, err := e.Apply(context.Background(), plan, allPolicy); err == nil {
		t.Fatal("want the injected error")
	}
	want := []string{
		"intend n-dead", "complete n-dead",
		"intend app-1", "complete app-1",
		"intend app-2", "abandon app-2",
	}
	if got := j.Log(); len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Errorf("transactions\n got %v\nwant %v first", got, want)
	}
	for _, a := range pub.Actions() {
		if a.Kind == "container" && a.Action == "removed" && a.Subject == "app-2" {
			t.Errorf("a removal event for the failed delete: %+v", a)
		}
	}

	dry := &fakePublisher{}
	dd, dj := testDeletes(t, dry, f)
	e = mustExecutor(t, ContainerExecutorDeps{Runtime: newFakeContainerRuntime(), Deletes: dd, Publisher: dry}, ContainerExecutorOptions{DryRun: true, Parallelism: 1})
	if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
		t.Fatal(err)
	}
	if l := dj.Log(); len(l) != 0 {
		t.Errorf("a dry run began transactions: %v", l)
	}
	acts := dry.Actions()
	if len(acts) == 0 {
		t.Fatal("a dry run published nothing")
	}
	for _, a := range acts {
		if a.Action != ActionSkipped {
			t.Errorf("a dry run published %s.%s, want only container.skipped", a.Kind, a.Action)
		}
		if cs, ok := a.Data.(ContainerSkip); !ok || cs.SkipReason != "dry-run" {
			t.Errorf("dry-run skip data %#v, want reason dry-run", a.Data)
		}
	}
}

// TestIntentsRecordIdentities: each intent records the identity of what
// it deletes as the node reported it right before: a container's creation
// time, an image's names with theirs (issue 34, item 4).
func TestIntentsRecordIdentities(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	d, j := testDeletes(t, &fakePublisher{}, f)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: d, Publisher: &fakePublisher{}}, ContainerExecutorOptions{Parallelism: 1, Clock: clock.System(func() time.Time { return at(time.Minute) })})
	if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
		t.Fatal(err)
	}
	if len(j.intents) == 0 {
		t.Fatal("no container intent recorded")
	}
	for _, in := range j.intents {
		if in.Identity == nil || !in.Identity.Created.Equal(fakeCreated) || len(in.Identity.Names) != 0 {
			t.Errorf("container %s intent identity %+v, want its creation time %v", in.Subject, in.Identity, fakeCreated)
		}
	}

	n := newNode()
	x := n.executor(policy8070)
	ij := &memJournal{}
	x.deletes, _ = deletion.New(deletion.Deps{Journal: ij, Checker: n.rt}, deletion.Options{RetryGap: time.Nanosecond})
	before := map[string][]ImageName{}
	for d, names := range n.rt.names {
		before[d] = slices.Clone(names)
	}
	if res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour))); res.Removed == 0 {
		t.Fatal("nothing removed")
	}
	if len(ij.intents) == 0 {
		t.Fatal("no image intent recorded")
	}
	for _, in := range ij.intents {
		want := &deletion.Identity{}
		for _, name := range before[in.Subject] {
			want.Names = append(want.Names, deletion.Name{Name: name.Name, Created: name.Created})
		}
		if in.Identity == nil || len(want.Names) == 0 || !slices.EqualFunc(in.Identity.Names, want.Names, func(a, b deletion.Name) bool {
			return a.Name == b.Name && a.Created.Equal(b.Created)
		}) {
			t.Errorf("image %s intent identity %+v, want %+v", in.Subject, in.Identity, want)
		}
	}
}

// TestContainerExecutorErrorButDeleted: a delete that reports an error
// although containerd committed it (the object is gone) is settled at
// once: exactly one removal event, not a failure (issue 25, finding 3).
func TestContainerExecutorErrorButDeleted(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	f.InjectError("delete-native", "n-dead", errors.New("context deadline exceeded"))
	f.Set("n-dead", LiveGone) // containerd deleted it; the reply was lost
	f.live["n-dead"] = LiveDead
	pub := &fakePublisher{}
	d, j := testDeletes(t, pub, f)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: d, Publisher: pub}, ContainerExecutorOptions{Parallelism: 1, Clock: clock.System(func() time.Time { return at(time.Minute) })})
	f.afterCall = func(op, id string) {
		if op == "delete-native" && id == "n-dead" {
			f.live["n-dead"] = LiveGone
		}
	}
	res, _ := e.Apply(context.Background(), plan, allPolicy)
	var got ContainerResult
	for _, r := range res {
		if r.ID == "n-dead" {
			got = r
		}
	}
	if got.Outcome != ContainerRemoved {
		t.Errorf("outcome %q (%s), want removed", got.Outcome, got.Error)
	}
	n := 0
	for _, a := range pub.Actions() {
		if a.Kind == "container" && a.Action == "removed" && a.Subject == "n-dead" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d removal events for n-dead, want 1 (journal %v)", n, j.Log())
	}
}

// TestContainerExecutorUnknownOutcomeStopsDeletes: a delete whose outcome
// containerd cannot tell leaves its intent pending, and no other delete
// begins until containerd says what happened (invariant 6).
func TestContainerExecutorUnknownOutcomeStopsDeletes(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	f.InjectError("delete-native", "n-dead", errors.New("unavailable"))
	f.errs["gone n-dead"] = errors.New("containerd is stopped")
	pub := &fakePublisher{}
	d, j := testDeletes(t, pub, f)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: d, Publisher: pub}, ContainerExecutorOptions{Parallelism: 1, Clock: clock.System(func() time.Time { return at(time.Minute) })})
	if _, err := e.Apply(context.Background(), plan, allPolicy); !errors.Is(err, deletion.ErrUnsettled) {
		t.Errorf("Apply: %v, want ErrUnsettled", err)
	}
	if got := j.Log(); !slices.Equal(got, []string{"intend n-dead"}) {
		t.Errorf("transactions after an unknown outcome: %v, want only the intent of n-dead", got)
	}
	if dels := f.Deletes(); len(dels) != 0 {
		t.Errorf("deletes after an unknown outcome: %v", dels)
	}
	if d.Unsettled() != 1 {
		t.Errorf("unsettled %d, want 1", d.Unsettled())
	}
	// containerd answers again: the next delete settles it first.
	delete(f.errs, "gone n-dead")
	f.live["n-dead"] = LiveGone
	if err := d.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := j.Log(); !slices.Equal(got, []string{"intend n-dead", "complete n-dead"}) {
		t.Errorf("settled: %v", got)
	}
}

// TestTransactionsKeepNamespacesApart: the same container id in two
// namespaces is two transactions, each event carries its own namespace's
// data (issue 25, finding 4).
func TestTransactionsKeepNamespacesApart(t *testing.T) {
	f := &nsContainerRuntime{newFakeContainerRuntime()}
	pub := &fakePublisher{}
	d, _ := testDeletes(t, pub, f)
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: d, Publisher: pub}, ContainerExecutorOptions{Parallelism: 2, Clock: clock.System(func() time.Time { return at(time.Minute) })})
	plan := ContainerPlan{Remove: []ContainerItem{
		{Namespace: "ci-a", ID: "fixed", EvictUnit: "fixed", Reason: ReasonTTLExpired},
		{Namespace: "ci-b", ID: "fixed", EvictUnit: "fixed", Reason: ReasonTTLExpired},
	}}
	if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, a := range pub.Actions() {
		r, ok := a.Data.(ContainerRemoval)
		if !ok || a.Action != "removed" {
			continue
		}
		if !strings.HasPrefix(a.Key, r.Namespace+"/") {
			t.Errorf("event of namespace %s has key %s", r.Namespace, a.Key)
		}
		if seen[r.Namespace] != "" {
			t.Errorf("two events for namespace %s", r.Namespace)
		}
		seen[r.Namespace] = a.Key
	}
	if len(seen) != 2 {
		t.Errorf("events by namespace %v, want one each for ci-a and ci-b", seen)
	}
}

// TestImageExecutorTransactions: the image executor begins the intent
// (key digest@firstSeen) while the image still has its names, a failed
// delete that did not happen is aborted, a removal is committed.
func TestImageExecutorTransactions(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("b"), errors.New("boom"))
	pub := &fakePublisher{}
	x := n.executorPublishing(t, policy8070, pub)
	j := &memJournal{pub: pub}
	x.deletes, _ = deletion.New(deletion.Deps{Journal: j, Checker: n.rt}, deletion.Options{RetryGap: time.Nanosecond})
	res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	if res.Removed == 0 {
		t.Fatal("nothing removed")
	}
	log := j.Log()
	if len(log) < 4 || log[0] != "intend "+digestOf("a") || log[1] != "complete "+digestOf("a") ||
		log[2] != "intend "+digestOf("b") || log[3] != "abandon "+digestOf("b") {
		t.Errorf("transactions: %v", log)
	}
	removed := 0
	for _, a := range pub.Actions() {
		if a.Kind == "image" && a.Action == "removed" {
			removed++
		}
	}
	if removed != res.Removed {
		t.Errorf("%d removal events for %d removals", removed, res.Removed)
	}
}

// TestImageExecutorErrorButDeleted: a synchronous image delete that fails
// after containerd committed it (past the call timeout, containerd stopped
// before it replied) is settled at once: one removal event with its
// measured bytes, and nothing more is deleted in that pass (issue 25,
// finding 3).
func TestImageExecutorErrorButDeleted(t *testing.T) {
	n := newNode()
	n.rt.failAfterRemove = map[string]error{digestOf("a"): errors.New("context deadline exceeded")}
	pub := &fakePublisher{}
	x := n.executorPublishing(t, policy8070, pub)
	res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	var a *ImageOutcome
	for i, o := range res.Outcomes {
		if o.Digest == digestOf("a") {
			a = &res.Outcomes[i]
		}
	}
	if a == nil || a.Action != ActionRemoved || a.Freed <= 0 {
		t.Fatalf("outcome of the image deleted with an error: %+v, want removed with measured bytes", a)
	}
	events := 0
	for _, ac := range pub.Actions() {
		if ac.Kind == "image" && ac.Action == "removed" && ac.Subject == digestOf("a") {
			events++
		}
	}
	if events != 1 {
		t.Errorf("%d removal events for the image, want 1", events)
	}
	// The delete may still be freeing space in containerd's GC: nothing
	// more goes on that measurement in this pass.
	if got := n.rt.Removed(); len(got) != 1 {
		t.Errorf("removed %v in the pass of a delete that reported an error, want only a", got)
	}
	if res.Measured {
		t.Error("the pass still trusts the measurement taken right after a delete that timed out")
	}
}

// TestImageExecutorUnknownOutcomeStops: when containerd cannot say
// whether an image delete happened, no image is deleted after it in the
// pass, no event is invented for it and the others are skipped as
// unsettled (invariant 6).
func TestImageExecutorUnknownOutcomeStops(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("a"), errors.New("unavailable"))
	n.rt.InjectError("gone", digestOf("a"), errors.New("containerd is stopped"))
	pub := &fakePublisher{}
	x := n.executorPublishing(t, policy8070, pub)
	plan := n.plan(policy8070, at(time.Hour))
	if len(plan.Delete) < 2 {
		t.Fatalf("the scenario needs two planned deletes, plan has %d", len(plan.Delete))
	}
	res := x.execute(context.Background(), plan)
	if got := n.rt.Removed(); len(got) != 0 {
		t.Errorf("removed after an unknown outcome: %v", got)
	}
	if res.Removed != 0 {
		t.Errorf("%d removals reported", res.Removed)
	}
	for _, ac := range pub.Actions() {
		if ac.Action == "removed" {
			t.Errorf("an event was invented: %+v", ac)
		}
	}
	unsettled := 0
	for _, o := range res.Outcomes {
		if o.Reason == ReasonUnsettled {
			unsettled++
		}
	}
	if unsettled != len(plan.Delete) {
		t.Errorf("%d outcomes unsettled, want all %d planned", unsettled, len(plan.Delete))
	}
}

// nsContainerRuntime keeps native containers apart by namespace.
type nsContainerRuntime struct{ *fakeContainerRuntime }

func (f *nsContainerRuntime) NativeLiveness(ctx context.Context, ns, id string) (Liveness, error) {
	return f.fakeContainerRuntime.NativeLiveness(ctx, ns, ns+"/"+id)
}

func (f *nsContainerRuntime) DeleteNative(ctx context.Context, ns, id string) (OwnerCleanup, error) {
	return f.fakeContainerRuntime.DeleteNative(ctx, ns, ns+"/"+id)
}

func (f *nsContainerRuntime) Gone(ctx context.Context, in deletion.Intent) (bool, error) {
	in.Subject = in.Namespace + "/" + in.Subject
	return f.fakeContainerRuntime.Gone(ctx, in)
}

// TestImageExecutorMeasuresAfterSettle: a delete whose outcome was
// unknown is settled by the next Begin; the pass that measured the disk
// before that deletes nothing more, the next one (measuring again) goes
// on (invariant 6).
func TestImageExecutorMeasuresAfterSettle(t *testing.T) {
	n := newNode()
	n.rt.failAfterRemove = map[string]error{digestOf("a"): errors.New("unavailable")}
	n.rt.InjectError("gone", digestOf("a"), errors.New("containerd is stopped"))
	pub := &fakePublisher{}
	x := n.executorPublishing(t, policy8070, pub)
	x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	if got := n.rt.Removed(); !slices.Equal(got, []string{digestOf("a")}) {
		t.Fatalf("first pass removed %v, want only a (its outcome unknown)", got)
	}
	// A pass measures the disk while a is unknown: it deletes nothing
	// and asks containerd nothing.
	n.disk.Fill(20 * mib)
	if res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour))); len(n.rt.Removed()) != 1 || res.Removed != 0 {
		t.Fatalf("a pass with an unknown outcome pending removed %v", n.rt.Removed()[1:])
	}
	// containerd answers again; the next pass measured the disk before
	// the manager (its Run) settled a: that measurement is stale.
	delete(n.rt.errs, "gone "+digestOf("a"))
	gen := x.generation()
	plan := n.plan(policy8070, at(time.Hour))
	if err := x.deletes.(*deletion.Manager).Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := x.executeFrom(context.Background(), plan, gen)
	if got := n.rt.Removed(); len(got) != 1 {
		t.Errorf("a pass removed %v on a measurement older than the settled delete", got[1:])
	}
	if res.Measured {
		t.Error("the pass still trusts its measurement")
	}
	events := 0
	for _, ac := range pub.Actions() {
		if ac.Action == "removed" && ac.Subject == digestOf("a") {
			events++
		}
	}
	if events != 1 {
		t.Errorf("%d removal events for a, want 1 (settled)", events)
	}
	x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	if got := n.rt.Removed(); len(got) < 2 {
		t.Errorf("the pass after re-measuring removed nothing: %v", got)
	}
}

// TestImageExecutorRetagBeforeDelete: the owner re-points the image's
// only name between the re-check and the delete, so nothing is deleted:
// the node says ErrOwnerWon (with ErrImageChanged). No removal is
// invented though the digest has no name left, and the pass goes on.
func TestImageExecutorRetagBeforeDelete(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("a"), fmt.Errorf("%w: %w", ErrOwnerWon, ErrImageChanged))
	n.rt.beforeRemove = func(d string) {
		if d == digestOf("a") {
			n.rt.mu.Lock()
			delete(n.rt.names, d) // the name now points at another digest
			n.rt.mu.Unlock()
		}
	}
	pub := &fakePublisher{}
	x := n.executorPublishing(t, policy8070, pub)
	res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))
	for _, ac := range pub.Actions() {
		if ac.Action == "removed" && ac.Subject == digestOf("a") {
			t.Errorf("a removal was invented for an image the owner re-tagged: %+v", ac)
		}
	}
	if got := reasons(res.Outcomes)[digestOf("a")]; got != ReasonChanged {
		t.Errorf("a: skip reason %q, want %q", got, ReasonChanged)
	}
	if !slices.Contains(n.rt.Removed(), digestOf("b")) {
		t.Errorf("the pass did not go on: removed %v", n.rt.Removed())
	}
}
