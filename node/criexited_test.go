package node

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// listingCRI answers CRI's two list calls with err, or with one exited
// container and one not-ready sandbox.
type listingCRI struct {
	runtime.RuntimeServiceClient
	err error
}

func (c listingCRI) ListContainers(context.Context, *runtime.ListContainersRequest, ...grpc.CallOption) (*runtime.ListContainersResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &runtime.ListContainersResponse{Containers: []*runtime.Container{{Id: "c1"}}}, nil
}

func (c listingCRI) StreamContainers(context.Context, *runtime.StreamContainersRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[runtime.StreamContainersResponse], error) {
	return &fakeCRIStream{err: status.Error(codes.Unimplemented, "unknown method StreamContainers")}, nil
}

func (c listingCRI) ListPodSandbox(context.Context, *runtime.ListPodSandboxRequest, ...grpc.CallOption) (*runtime.ListPodSandboxResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &runtime.ListPodSandboxResponse{Items: []*runtime.PodSandbox{{Id: "s1"}}}, nil
}

// TestCRIExitedFailures: a CRI list that fails gives no exits (they are
// kept), and says so, unless CRI is simply not there.
func TestCRIExitedFailures(t *testing.T) {
	for _, tt := range []struct {
		name    string
		err     error
		exits   int
		warns   int
		askEach bool
	}{
		{"listed", nil, 2, 0, false},
		// The sandboxes' list fails too (this fake's lists fail alike).
		{"over containerd's send limit", status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (22800000 vs. 16777216)"), 0, 1, true},
		{"no CRI plugin", status.Error(codes.Unimplemented, "unknown service runtime.v1.RuntimeService"), 0, 0, false},
	} {
		var buf bytes.Buffer
		s := NewSource(Options{CRI: listingCRI{err: tt.err}, Log: zerolog.New(&buf)})
		exited, askEach := s.criExited(context.Background())
		if askEach != tt.askEach {
			t.Errorf("%s: askEach %v, want %v", tt.name, askEach, tt.askEach)
		}
		if len(exited) != tt.exits {
			t.Errorf("%s: %d exits %v, want %d", tt.name, len(exited), exited, tt.exits)
		}
		if n := strings.Count(buf.String(), `"level":"warn"`); n != tt.warns {
			t.Errorf("%s: %d warnings, want %d:\n%s", tt.name, n, tt.warns, buf.String())
		}
	}
}
