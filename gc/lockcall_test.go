package gc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
)

// endingLock is containerd's agent lock as a delete sees it: held when
// the transaction begins; at the call, held until deadline, or ended
// (holdErr) in between (a slow settle or fsync, a frozen process).
type endingLock struct {
	deadline time.Time
	holdErr  error
}

var _ deletion.Lock = (*endingLock)(nil)

func (l *endingLock) Held() error { return nil }

func (l *endingLock) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if l.holdErr != nil {
		return ctx, func() {}, l.holdErr
	}
	c, cancel := context.WithDeadline(ctx, l.deadline)
	return c, cancel, nil
}

func lockedDeletes(t *testing.T, c deletion.Checker, l deletion.Lock) *deletion.Manager {
	t.Helper()
	m, err := deletion.New(deletion.Deps{Journal: &memJournal{}, Checker: c, Lock: l}, deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sent records the contexts the delete requests were sent with, and
// refuses, as gRPC does, a request whose context has ended.
type sent struct {
	mu        sync.Mutex
	deadlines []time.Time
}

func (s *sent) send(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rpc error: code = Canceled desc = %w", err)
	}
	dl, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, dl)
	s.mu.Unlock()
	return nil
}

type grpcImages struct {
	*fakeRuntime
	sent
}

func (g *grpcImages) RemoveImage(ctx context.Context, ns, digest string, names []ImageName) (string, error) {
	if err := g.send(ctx); err != nil {
		return "native", err
	}
	return g.fakeRuntime.RemoveImage(ctx, ns, digest, names)
}

type grpcContainers struct {
	*fakeContainerRuntime
	sent
}

func (g *grpcContainers) DeleteNative(ctx context.Context, ns, id string) (OwnerCleanup, error) {
	if err := g.send(ctx); err != nil {
		return OwnerCleanup{}, err
	}
	return g.fakeContainerRuntime.DeleteNative(ctx, ns, id)
}

func (g *grpcContainers) RemoveCRIContainer(ctx context.Context, id string) error {
	if err := g.send(ctx); err != nil {
		return err
	}
	return g.fakeContainerRuntime.RemoveCRIContainer(ctx, id)
}

func (g *grpcContainers) RemoveCRISandbox(ctx context.Context, id string) error {
	if err := g.send(ctx); err != nil {
		return err
	}
	return g.fakeContainerRuntime.RemoveCRISandbox(ctx, id)
}

// TestDeleteCallsEndWithTheLocksHold: the agent lock is checked again
// right before each delete call, not only when its transaction begins:
// every image and container delete is sent with a context that ends when
// the hold ends, and a hold that ended after Begin (its settle, the
// intent's fsync or the re-check took that long, or the process froze)
// sends nothing and deletes nothing.
func TestDeleteCallsEndWithTheLocksHold(t *testing.T) {
	end := time.Now().Add(17 * time.Second)
	ended := errors.New("this agent does not hold containerd's agent lock now: not renewed for 20s")
	for _, tc := range []struct {
		name string
		lock *endingLock
	}{
		{"held: the call ends with the hold", &endingLock{deadline: end}},
		{"the hold ended after Begin", &endingLock{holdErr: ended}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode()
			x := n.executor(policy8070)
			rt := &grpcImages{fakeRuntime: n.rt}
			x.rt, x.deletes = rt, lockedDeletes(t, n.rt, tc.lock)
			res := x.execute(context.Background(), n.plan(policy8070, at(time.Hour)))

			p := PlanContainers(nodeState(), allPolicy, at(time.Minute))
			f := newFakeContainerRuntime()
			cr := &grpcContainers{fakeContainerRuntime: f}
			out, _ := mustExecutor(t, ContainerExecutorDeps{Runtime: cr, Deletes: lockedDeletes(t, f, tc.lock)},
				ContainerExecutorOptions{}).Apply(context.Background(), p, allPolicy)

			if tc.lock.holdErr != nil {
				if got := n.rt.Removed(); len(got) != 0 || res.Removed != 0 {
					t.Errorf("images removed after the hold ended: %v", got)
				}
				if got := f.Deletes(); len(got) != 0 {
					t.Errorf("containers deleted after the hold ended: %v", got)
				}
				for _, r := range out {
					if r.Outcome == ContainerRemoved {
						t.Errorf("container %s reported removed after the hold ended", r.ID)
					}
				}
				return
			}
			if res.Removed == 0 || len(f.Deletes()) == 0 {
				t.Fatalf("nothing deleted while held: %d images, containers %v", res.Removed, f.Deletes())
			}
			for what, s := range map[string]*sent{"image": &rt.sent, "container": &cr.sent} {
				for _, dl := range s.deadlines {
					if !dl.Equal(end) {
						t.Errorf("a %s delete sent with deadline %v, want the end of the hold %v", what, dl, end)
					}
				}
			}
		})
	}
}
