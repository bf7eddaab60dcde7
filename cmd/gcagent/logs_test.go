package main

import (
	"context"
	"errors"
	"testing"

	"github.com/gcagent/gcagent/projection"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRI answers ListPodSandbox only.
type fakeCRI struct {
	runtimeapi.RuntimeServiceClient
	uids map[string]bool
	err  error
}

func (f fakeCRI) ListPodSandbox(_ context.Context, in *runtimeapi.ListPodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	resp := &runtimeapi.ListPodSandboxResponse{}
	if uid := in.GetFilter().GetLabelSelector()["io.kubernetes.pod.uid"]; f.uids[uid] {
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{Id: "sb-" + uid})
	}
	return resp, nil
}

// TestPodStateConfirmsWithCRI: a pod the projection does not see alive is
// confirmed gone by CRI before its log dir may go; a CRI error keeps it.
func TestPodStateConfirmsWithCRI(t *testing.T) {
	empty := projection.New()
	view := func(fn func(*projection.State)) { fn(empty) }
	cases := []struct {
		name      string
		cri       fakeCRI
		wantAlive bool
		wantKnown bool
	}{
		{"CRI has a sandbox of the uid", fakeCRI{uids: map[string]bool{"u1": true}}, true, true},
		{"CRI has none: unknown, the grace decides", fakeCRI{uids: map[string]bool{}}, false, false},
		{"CRI fails: keep", fakeCRI{err: errors.New("unavailable")}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			alive, _, known := logsState{view: view, cri: tc.cri}.PodState("u1")
			if alive != tc.wantAlive || known != tc.wantKnown {
				t.Fatalf("PodState = alive %v known %v, want %v %v", alive, known, tc.wantAlive, tc.wantKnown)
			}
		})
	}
}
