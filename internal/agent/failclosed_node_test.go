package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
)

// The decision table's rows for the inputs the node adapter reads on the
// agent's behalf (issue 34 items 3, 4, 6 and 7): the names a CRI removal
// deletes, the identity an intent is settled by, the state of a CRI
// container containerd holds no task for, and containerd's agent lock.
// The node's answers are faked as its own and end-to-end tests show them;
// what the agent makes of them runs for real (executor, delete
// transaction, reconcile, planner, the lock).

// nodeRows are those rows.
func nodeRows() []failClosedRow {
	born := tableNow.Add(-time.Hour)
	// criImage: the target is a CRI image (its tag and CRI's id ref, both
	// CRI's), with native names CRI does not know; a pull makes made
	// during CRI's RemoveImage.
	criImage := func(native []string, made ...string) func(*testing.T, *imageWorld) {
		return func(_ *testing.T, w *imageWorld) {
			img := w.images[target]
			img.criNames = []string{"example.test/a:1", "sha256:cfg-aaaa"}
			img.names = append(slices.Clone(img.criNames), native...)
			img.born = map[string]time.Time{}
			synced := w.events[len(w.events)-1]
			w.events = w.events[:len(w.events)-1]
			for _, name := range img.names {
				img.born[name] = born
				w.events = append(w.events, events.ImageUpserted{At: born, Name: name, Digest: target, Size: 8 * mib,
					ConfigDigest: "sha256:cfg-aaaa", ChainID: "sha256:chain-aaaa"})
			}
			w.events = append(w.events, synced)
			img.madeDuring, img.madeAt = made, tableNow
		}
	}
	cri := func(made ...string) func(*testing.T, *imageWorld) { return criImage(nil, made...) }
	return []failClosedRow{
		// The names a CRI removal deletes (node.Runtime.RemoveImage).
		{input: "CRI removal names", state: "known", world: "the names CRI removes are those the re-check read, records and all",
			run: namesRow(cri()), want: "removed; left: none"},
		{input: "CRI removal names", state: "unknown", world: "CRI removed its names; the names left cannot be read (containerd stops answering): a name CRI did not know stays",
			run: namesRow(func(t *testing.T, w *imageWorld) {
				criImage([]string{"example.test/native:1"})(t, w) // tagged natively: CRI does not know it
				img := w.images[target]
				img.rereadErr = errors.New("list images: Unavailable")
				img.goneErr = errors.New("list images: Unavailable")
			}), want: "kept: unsettled; left: example.test/native:1"},
		{input: "CRI removal names", state: "stale", world: "a pull makes example.test/a:1 again and example.test/a:2 during CRI's RemoveImage: names the re-check never read",
			run: namesRow(cri("example.test/a:1", "example.test/a:2")), want: "removed; left: example.test/a:1,example.test/a:2"},
		// The identity an intent is settled by (deletion.Identity, node.Runtime.Gone).
		{input: "intent identity", state: "known", world: "a container's removal, the agent killed before its commit; at the restart a container of that id, made again since (another creation time)",
			run: intentRow(&deletion.Identity{Created: born}, true, born.Add(time.Minute), 0), want: "settled: removed, event published"},
		{input: "intent identity", state: "unknown", world: "an intent an earlier version left (no identity); a container of that id is there: the same or made again, it cannot tell",
			run: intentRow(nil, true, born.Add(time.Minute), 0), want: "settled: not removed, no event"},
		{input: "intent identity", state: "stale", world: "the removal failed, the container is still there; the wall clock stepped back an hour before the intent is settled",
			run: intentRow(&deletion.Identity{Created: born}, true, born, -time.Hour), want: "settled: not removed, no event"},
		// The state of a CRI container without a task (node.Source's
		// listing asks CRI: criStates).
		{input: "taskless CRI container", state: "known", world: "created, started and exited (status 2) while the agent was away; containerd holds no task, CRI says exited 2",
			run:  tasklessRow(events.Task{ContainerID: "c-2", Status: events.TaskStopped, ExitStatus: 2, ExitedAt: tableNow.Add(-30 * time.Second)}),
			want: "exited (2)"},
		{input: "taskless CRI container", state: "unknown", world: "CRI does not answer its status: the listing holds a task of unknown status, and another listing follows",
			run: tasklessRow(events.Task{ContainerID: "c-2", Status: events.TaskUnknown}), want: "created (0)"},
		{input: "taskless CRI container", state: "stale", world: "the projection saw it run; CRI still says running (its exit handler deleted the task, the exit not recorded yet)",
			run:  tasklessRow(events.Task{ContainerID: "c-2", Status: events.TaskUnknown}, events.TaskStarted{At: tableNow.Add(-time.Minute), ContainerID: "c-2", Pid: 9}),
			want: "running (0)"},
		// containerd's agent lock (node.AgentLock).
		{input: "agent lock", state: "known", world: "this agent holds the lock",
			run: lockRow(func(_ *testing.T, l *node.AgentLock, _ *node.AgentLock, _ *clock.Fake) {}), want: "removed"},
		{input: "agent lock", state: "unknown", world: "not taken yet: containerd has not answered the lock's first read",
			run: lockRow(nil), want: "kept: error (not taken yet)"},
		{input: "agent lock", state: "stale", world: "another agent took the lock over (--take-over); this one's next renewal finds it lost",
			run: lockRow(func(t *testing.T, l, other *node.AgentLock, clk *clock.Fake) {
				if err := other.Acquire(context.Background(), true); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- l.Run(ctx) }()
				for {
					select {
					case err := <-done:
						var lost *node.LostError
						if !errors.As(err, &lost) {
							t.Fatalf("renewal after the take-over: %v, want a LostError", err)
						}
						return
					case <-clk.Arms():
						clk.Step(node.DefaultLockPeriod)
					case <-time.After(30 * time.Second):
						t.Fatal("the renewal did not come")
					}
				}
			}), want: "kept: error (taken over by node n, pid 2, state dir /other)"},
	}
}

// namesRow runs an image world whose target image is changed by setup
// and says what became of it, and the names left on it.
func namesRow(setup func(*testing.T, *imageWorld)) func(t *testing.T) string {
	return func(t *testing.T) string {
		w := newImageWorld(map[string]string{target: "example.test/a:1"})
		setup(t, w)
		got := w.pass(t)[target]
		if asked := w.images[target].asked; len(asked) > 0 {
			// The executor asks to delete the names the re-check read,
			// each with its record's creation time.
			for _, n := range asked {
				if want := w.images[target].born[n.Name]; !n.Created.Equal(want) && !slices.Contains(w.images[target].madeDuring, n.Name) {
					t.Errorf("asked to delete %s created %s, the re-check read %s", n.Name, n.Created, want)
				}
			}
		}
		left := strings.Join(w.node.left(target), ",")
		if left == "" {
			left = "none"
		}
		return got + "; left: " + left
	}
}

// intentJournal is a delete journal holding one intent a crash left; it
// says whether it was completed (its event stored) or abandoned.
type intentJournal struct {
	tableJournal
	left    deletion.Intent
	settled string
}

func (j *intentJournal) Pending() ([]deletion.Intent, error) { return []deletion.Intent{j.left}, nil }
func (j *intentJournal) Complete(deletion.Intent, any) error {
	j.settled = "removed, event published"
	return nil
}
func (j *intentJournal) Abandon(deletion.Intent) error {
	j.settled = "not removed, no event"
	return nil
}

// containerAt is the node for an intent row: a container of the intent's
// id, found or not, with its creation time, settled by node.Runtime.Gone's
// rule (deletion.Identity).
type containerAt struct {
	found   bool
	created time.Time
}

func (c containerAt) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	return in.Identity.ContainerGone(c.found, c.created), nil
}

// intentRow settles, on an agent's clock stepped by step since the intent,
// the removal of container c-1 recorded with identity id (nil: none, an
// earlier version's), the node holding a container of that id (found)
// created at created.
func intentRow(id *deletion.Identity, found bool, created time.Time, step time.Duration) func(t *testing.T) string {
	return func(t *testing.T) string {
		data, _ := json.Marshal(map[string]string{"id": "c-1"})
		j := &intentJournal{left: deletion.Intent{Seq: 1, At: tableNow.Add(-time.Minute), Namespace: events.CRINamespace, Kind: "container",
			Action: schema.ActionRemoved, Subject: "c-1", Key: "c-1@1", Data: data, Identity: id}}
		now := tableNow.Add(step)
		m, err := deletion.New(deletion.Deps{Journal: j, Checker: containerAt{found: found, created: created}},
			deletion.Options{Clock: clock.System(func() time.Time { return now })})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Settle(context.Background()); err != nil {
			t.Fatal(err)
		}
		return "settled: " + j.settled
	}
}

// tasklessRow is a pod whose container c-2 the projection saw created
// (and, with more, what else it saw of it) before the agent went away;
// the listing after finds no task for it and holds what the node's
// listing made of CRI's answer (task). It returns c-2's state and exit
// status once the listing is applied.
func tasklessRow(task events.Task, more ...events.Event) func(t *testing.T) string {
	return func(t *testing.T) string {
		at := tableNow.Add(-2 * time.Minute)
		ctr := events.ContainerUpserted{At: at, ID: "c-2", Image: "example.test/app:1", CRIKind: projection.KindContainer, PodUID: "u-web",
			PodName: "web", PodNamespace: "default", ContainerName: "app", SandboxID: "sb-web", Created: at}
		sb := events.ContainerUpserted{At: at, ID: "sb-web", Image: "registry.k8s.io/pause:3.10", CRIKind: projection.KindSandbox,
			PodUID: "u-web", PodName: "web", PodNamespace: "default", SandboxID: "sb-web", Created: at}
		s := projection.New()
		for _, ev := range append([]events.Event{sb, events.TaskStarted{At: at, ContainerID: "sb-web", Pid: 1}, ctr}, more...) {
			s.Apply(ev)
		}
		s.Apply(events.Synced{At: at})
		l := events.Listing{At: tableNow, Containers: []events.ContainerUpserted{sb, ctr},
			Tasks: []events.Task{{ContainerID: "sb-web", Pid: 1, Status: events.TaskRunning}, task}}
		for _, ev := range projection.Reconcile(s, l) {
			s.Apply(ev)
		}
		c := s.Containers["c-2"]
		return fmt.Sprintf("%s (%d)", c.State, c.ExitStatus)
	}
}

// lockRow runs an image pass whose deletes need containerd's agent lock,
// held by an agent that took it at start and then went through setup
// (with another agent on the same containerd, and the agents' clock); a
// nil setup: the lock was never taken. The skip says why when a delete
// could not begin.
func lockRow(setup func(t *testing.T, l, other *node.AgentLock, clk *clock.Fake)) func(t *testing.T) string {
	return func(t *testing.T) string {
		store, clk := newLeaseMem(), clock.NewFake(tableNow)
		lock := node.NewAgentLock(store, node.AgentID{Node: "n", Pid: 1, StateDir: "/var/lib/gcagent", StateID: "a"},
			node.LockOptions{Clock: clk, Log: zerolog.Nop()})
		other := node.NewAgentLock(store, node.AgentID{Node: "n", Pid: 2, StateDir: "/other", StateID: "b"},
			node.LockOptions{Clock: clk, Log: zerolog.Nop()})
		if setup != nil {
			if err := lock.Acquire(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			setup(t, lock, other, clk)
		}
		w := newImageWorld(map[string]string{target: "example.test/a:1"})
		w.now, w.lock = clk.Now(), lock
		got := w.pass(t)[target]
		if err := lock.Held(); err != nil && got != "removed" {
			got += " (" + strings.TrimPrefix(err.Error(), node.ErrNotHeld.Error()+": ") + ")"
		}
		return got
	}
}

// leaseMem is containerd's lease store in memory: Create of an id that
// exists fails with AlreadyExists, atomically, as containerd's does.
type leaseMem struct {
	mu     sync.Mutex
	leases map[string]leases.Lease
}

func newLeaseMem() *leaseMem { return &leaseMem{leases: map[string]leases.Lease{}} }

func (m *leaseMem) Create(_ context.Context, opts ...leases.Opt) (leases.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return leases.Lease{}, err
		}
	}
	if _, ok := m.leases[l.ID]; ok {
		return leases.Lease{}, fmt.Errorf("lease %q: %w", l.ID, errdefs.ErrAlreadyExists)
	}
	m.leases[l.ID] = l
	return l, nil
}

func (m *leaseMem) Delete(_ context.Context, l leases.Lease, _ ...leases.DeleteOpt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.leases[l.ID]; !ok {
		return errdefs.ErrNotFound
	}
	delete(m.leases, l.ID)
	return nil
}

func (m *leaseMem) List(context.Context, ...string) ([]leases.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []leases.Lease
	for _, l := range m.leases {
		out = append(out, l)
	}
	return out, nil
}
