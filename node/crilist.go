package node

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criStates are the container states CRIContainers asks one at a time
// when the whole list is over the runtime's send limit. UNKNOWN comes
// first (CRI only leaves it for EXITED), then the lifecycle in its order:
// a container moves forward only, so one that exists at the first call is
// in the state asked at some later call, and no state is missed between
// two calls.
var criStates = [...]runtime.ContainerState{
	runtime.ContainerState_CONTAINER_UNKNOWN,
	runtime.ContainerState_CONTAINER_CREATED,
	runtime.ContainerState_CONTAINER_RUNNING,
	runtime.ContainerState_CONTAINER_EXITED,
}

// CRIContainers returns the CRI containers that filter (nil: all) selects,
// however many the runtime holds. It streams them where the runtime
// implements StreamContainers (KEP-5825: no message limit); else it lists
// them, and a list over the runtime's send limit (containerd's is 16 MiB,
// about 20,000 containers, unless [grpc] max_send_message_size is raised)
// is asked again one state at a time. A state whose own list is over the
// limit fails with codes.ResourceExhausted and an error that names the
// setting: the caller learns it has no complete answer.
func CRIContainers(ctx context.Context, cri runtime.RuntimeServiceClient, filter *runtime.ContainerFilter) ([]*runtime.Container, error) {
	ctrs, err := streamCRIContainers(ctx, cri, filter)
	if status.Code(err) != codes.Unimplemented {
		return ctrs, err
	}
	resp, err := cri.ListContainers(ctx, &runtime.ListContainersRequest{Filter: filter})
	if err == nil {
		return resp.Containers, nil
	}
	if status.Code(err) != codes.ResourceExhausted || filter.GetState() != nil {
		return nil, tooLarge(err)
	}
	var all []*runtime.Container
	seen := map[string]bool{} // one that moved on between two calls is in both
	for _, st := range criStates {
		f := &runtime.ContainerFilter{Id: filter.GetId(), PodSandboxId: filter.GetPodSandboxId(), LabelSelector: filter.GetLabelSelector(),
			State: &runtime.ContainerStateValue{State: st}}
		resp, err := cri.ListContainers(ctx, &runtime.ListContainersRequest{Filter: f})
		if err != nil {
			return nil, fmt.Errorf("%s containers: %w", st, tooLarge(err))
		}
		for _, c := range resp.Containers {
			if !seen[c.Id] {
				seen[c.Id] = true
				all = append(all, c)
			}
		}
	}
	return all, nil
}

// streamCRIContainers collects StreamContainers' lists; Unimplemented when
// the runtime predates it.
func streamCRIContainers(ctx context.Context, cri runtime.RuntimeServiceClient, filter *runtime.ContainerFilter) ([]*runtime.Container, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout) // a stream has no deadline of its own
	defer cancel()
	stream, err := cri.StreamContainers(ctx, &runtime.StreamContainersRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	var all []*runtime.Container
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return all, nil
		}
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Containers...)
	}
}

// tooLarge adds to a list over the runtime's send limit what lifts it.
func tooLarge(err error) error {
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("%w (raise containerd's [grpc] max_send_message_size, or run a containerd with CRI's StreamContainers)", err)
	}
	return err
}
