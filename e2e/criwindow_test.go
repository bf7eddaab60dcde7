package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
)

// criWindow is CRI holding its exit handler's window open for container
// id until release is closed: containerd has no task for it any more (CRI
// deleted it), but CRI has not recorded the exit and says it runs. On a
// loaded node that window is what a listing racing a short-lived
// container sees.
type criWindow struct {
	runtime.RuntimeServiceClient
	id      string
	release chan struct{}
}

func (w criWindow) open() bool {
	select {
	case <-w.release:
		return false
	default:
		return true
	}
}

func (w criWindow) ContainerStatus(ctx context.Context, in *runtime.ContainerStatusRequest, opts ...grpc.CallOption) (*runtime.ContainerStatusResponse, error) {
	resp, err := w.RuntimeServiceClient.ContainerStatus(ctx, in, opts...)
	if err == nil && in.ContainerId == w.id && w.open() && resp.Status != nil {
		st := proto.Clone(resp.Status).(*runtime.ContainerStatus)
		st.State, st.ExitCode, st.FinishedAt = runtime.ContainerState_CONTAINER_RUNNING, 0, 0
		resp = &runtime.ContainerStatusResponse{Status: st}
	}
	return resp, err
}

func (w criWindow) ListContainers(ctx context.Context, in *runtime.ListContainersRequest, opts ...grpc.CallOption) (*runtime.ListContainersResponse, error) {
	resp, err := w.RuntimeServiceClient.ListContainers(ctx, in, opts...)
	if err != nil || !w.open() {
		return resp, err
	}
	out := &runtime.ListContainersResponse{}
	for _, c := range resp.Containers {
		if c.Id == w.id {
			if in.GetFilter().GetState() != nil {
				continue // not in the state asked: it "runs"
			}
			c = proto.Clone(c).(*runtime.Container)
			c.State = runtime.ContainerState_CONTAINER_RUNNING
		}
		out.Containers = append(out.Containers, c)
	}
	return out, nil
}

func (w criWindow) StreamContainers(context.Context, *runtime.StreamContainersRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[runtime.StreamContainersResponse], error) {
	return nil, status.Error(codes.Unimplemented, "unknown method StreamContainers") // lists go through ListContainers
}

// TestListingConvergesAfterCRIsExitWindow: a CRI container created,
// started and exited before the agent listed (as while it reconnected
// after a containerd restart) is listed without a task while CRI still
// says it runs. The listing guesses no state for it, and the agent lists
// again until CRI tells: the projection converges to exited with CRI's
// exit status, with no event from containerd to prompt it (issue 34,
// item 7).
func TestListingConvergesAfterCRIsExitWindow(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 64 << 10}), testenv.Pause(c.SandboxImage))
		pod := c.RunPod(t, rt, "window", "default", "0d6f7c1e-uid-window")
		id := c.RunPodContainer(t, rt, pod, "job", "example.test/job:1", "sh", "-c", "exit 2")
		testenv.Eventually(t, 30*time.Second, func() string {
			resp, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: id})
			if err != nil || resp.Status.State != runtime.ContainerState_CONTAINER_EXITED {
				return fmt.Sprintf("job not exited yet: %v", err)
			}
			return ""
		})

		window := criWindow{RuntimeServiceClient: rt, id: id, release: make(chan struct{})}
		src := node.NewSource(node.Options{Client: c.Client, CRI: window, Log: zerolog.Nop()})
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan events.Scoped, 64)
		var (
			mu sync.Mutex
			st = projection.New()
			wg sync.WaitGroup
		)
		wg.Add(2)
		go func() { defer wg.Done(); _ = src.Run(ctx, out) }()
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-out:
					if ev.Namespace != events.CRINamespace {
						continue
					}
					mu.Lock()
					if l, ok := ev.Event.(events.Listing); ok {
						for _, e := range projection.Reconcile(st, l) {
							st.Apply(e)
						}
					} else {
						st.Apply(ev.Event)
					}
					mu.Unlock()
				}
			}
		}()
		t.Cleanup(func() { cancel(); wg.Wait() })
		job := func() (projection.Container, bool) {
			mu.Lock()
			defer mu.Unlock()
			ct := st.Containers[id]
			if !st.Synced || ct == nil {
				return projection.Container{}, false
			}
			return *ct, true
		}

		testenv.Eventually(t, 30*time.Second, func() string {
			if _, ok := job(); !ok {
				return "the listing is not applied yet"
			}
			return ""
		})
		if ct, _ := job(); ct.State == projection.StateExited {
			t.Fatalf("while CRI says the job runs, the listing made it exited (status %d): a guess", ct.ExitStatus)
		}
		close(window.release) // CRI records the exit
		testenv.Eventually(t, 30*time.Second, func() string {
			if ct, _ := job(); ct.State != projection.StateExited || ct.ExitStatus != 2 {
				return fmt.Sprintf("job is %s with exit status %d, want exited 2 as CRI reports", ct.State, ct.ExitStatus)
			}
			return ""
		})
	})
}
