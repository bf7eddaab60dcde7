package node

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRIList is a CRI runtime whose list calls obey a send limit of
// limit containers per message (0: none), whose StreamContainers answers
// Unimplemented unless stream is set, and whose containers may move
// forward a state after each list call (advance).
type fakeCRIList struct {
	runtime.RuntimeServiceClient
	ctrs    []*runtime.Container
	limit   int
	stream  bool
	calls   []string // each call, in order
	lists   int      // ListContainers calls
	advance func(list int)
}

var _ runtime.RuntimeServiceClient = (*fakeCRIList)(nil)

func (f *fakeCRIList) selected(filter *runtime.ContainerFilter) []*runtime.Container {
	var out []*runtime.Container
	for _, c := range f.ctrs {
		if (filter.GetState() == nil || c.State == filter.GetState().State) &&
			(filter.GetPodSandboxId() == "" || c.PodSandboxId == filter.GetPodSandboxId()) {
			out = append(out, &runtime.Container{Id: c.Id, State: c.State, PodSandboxId: c.PodSandboxId})
		}
	}
	return out
}

func (f *fakeCRIList) ListContainers(_ context.Context, r *runtime.ListContainersRequest, _ ...grpc.CallOption) (*runtime.ListContainersResponse, error) {
	f.calls = append(f.calls, fmt.Sprintf("list state=%v sandbox=%q", r.Filter.GetState().GetState(), r.Filter.GetPodSandboxId()))
	out := f.selected(r.Filter)
	if f.lists++; f.advance != nil {
		f.advance(f.lists)
	}
	if f.limit > 0 && len(out) > f.limit {
		return nil, status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", len(out), f.limit)
	}
	return &runtime.ListContainersResponse{Containers: out}, nil
}

func (f *fakeCRIList) StreamContainers(_ context.Context, r *runtime.StreamContainersRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[runtime.StreamContainersResponse], error) {
	f.calls = append(f.calls, "stream")
	if !f.stream {
		return &fakeCRIStream{err: status.Error(codes.Unimplemented, "unknown method StreamContainers for service runtime.v1.RuntimeService")}, nil
	}
	out := f.selected(r.Filter)
	var msgs []*runtime.StreamContainersResponse
	for len(out) > 0 { // lists of at most 2
		n := min(2, len(out))
		msgs, out = append(msgs, &runtime.StreamContainersResponse{Containers: out[:n]}), out[n:]
	}
	return &fakeCRIStream{msgs: msgs}, nil
}

// fakeCRIStream sends msgs, then EOF; or err at the first Recv, as gRPC
// reports a method the server lacks.
type fakeCRIStream struct {
	grpc.ClientStream
	msgs []*runtime.StreamContainersResponse
	err  error
}

func (s *fakeCRIStream) Recv() (*runtime.StreamContainersResponse, error) {
	if s.err != nil {
		return nil, s.err
	}
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

// criNode is n containers per state, in sandboxes sb0 and sb1.
func criNode(n int) []*runtime.Container {
	var ctrs []*runtime.Container
	for _, st := range criStates {
		for i := range n {
			ctrs = append(ctrs, &runtime.Container{Id: fmt.Sprintf("%s-%d", st, i), State: st, PodSandboxId: fmt.Sprintf("sb%d", i%2)})
		}
	}
	return ctrs
}

func ids(ctrs []*runtime.Container) []string {
	out := make([]string, len(ctrs))
	for i, c := range ctrs {
		out[i] = c.Id
	}
	slices.Sort(out)
	return out
}

// TestCRIContainers: every container is listed, whatever the send limit,
// as long as one state's list fits; the calls made are the fewest that
// can tell.
func TestCRIContainers(t *testing.T) {
	exited := &runtime.ContainerFilter{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_EXITED}}
	sb1 := &runtime.ContainerFilter{PodSandboxId: "sb1"}
	for _, tt := range []struct {
		name      string
		limit     int
		stream    bool
		filter    *runtime.ContainerFilter
		want      int // containers; -1: a ResourceExhausted error
		wantCalls int
	}{
		{"streamed", 3, true, nil, 12, 1},
		{"streamed, filtered", 0, true, sb1, 4, 1},
		{"listed whole", 0, false, nil, 12, 2},
		{"split by state", 3, false, nil, 12, 6},
		{"split by state, the filter's sandbox kept", 2, false, sb1, 4, 6},
		{"a state over the limit", 2, false, nil, -1, 3}, // stream, list, UNKNOWN fails
		{"a state filter is not split", 2, false, exited, -1, 2},
		{"a state filter that fits", 3, false, exited, 3, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCRIList{ctrs: criNode(3), limit: tt.limit, stream: tt.stream}
			got, err := CRIContainers(context.Background(), f, tt.filter)
			if len(f.calls) != tt.wantCalls {
				t.Errorf("%d calls %q, want %d", len(f.calls), f.calls, tt.wantCalls)
			}
			if tt.want < 0 {
				if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_send_message_size") {
					t.Fatalf("err %v, want ResourceExhausted naming max_send_message_size", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := ids(f.selected(tt.filter))
			if len(want) != tt.want || !slices.Equal(ids(got), want) {
				t.Fatalf("got %v, want %v (%d)", ids(got), want, tt.want)
			}
		})
	}
}

// TestCRIContainersSplitRace: a container that moves forward (created,
// running, exited) while the states are asked one by one is listed exactly
// once, whenever it moves.
func TestCRIContainersSplitRace(t *testing.T) {
	next := map[runtime.ContainerState]runtime.ContainerState{
		runtime.ContainerState_CONTAINER_CREATED: runtime.ContainerState_CONTAINER_RUNNING,
		runtime.ContainerState_CONTAINER_RUNNING: runtime.ContainerState_CONTAINER_EXITED,
		runtime.ContainerState_CONTAINER_UNKNOWN: runtime.ContainerState_CONTAINER_EXITED,
	}
	for _, start := range criStates {
		for moves := range 1 << 5 { // after which of the 5 list calls it moves on
			f := &fakeCRIList{ctrs: criNode(2), limit: 3}
			mover := &runtime.Container{Id: "mover", State: start}
			f.ctrs = append(f.ctrs, mover)
			f.advance = func(list int) {
				if moves&(1<<(list-1)) != 0 {
					if st, ok := next[mover.State]; ok {
						mover.State = st
					}
				}
			}
			got, err := CRIContainers(context.Background(), f, nil)
			if err != nil {
				t.Fatalf("from %s, moves %05b: %v", start, moves, err)
			}
			if n := strings.Count(strings.Join(ids(got), " "), "mover"); n != 1 {
				t.Fatalf("from %s, moves %05b (calls %q): listed %d times, want once", start, moves, f.calls, n)
			}
		}
	}
}
