package node

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
)

// statesCRI answers ContainerStatus from states (missing: NotFound) and
// ListPodSandbox from sandboxes, or fails both with err.
type statesCRI struct {
	runtime.RuntimeServiceClient
	states    map[string]*runtime.ContainerStatus
	sandboxes []*runtime.PodSandbox
	err       error
}

func (c statesCRI) ContainerStatus(_ context.Context, in *runtime.ContainerStatusRequest, _ ...grpc.CallOption) (*runtime.ContainerStatusResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	st, ok := c.states[in.ContainerId]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", in.ContainerId)
	}
	return &runtime.ContainerStatusResponse{Status: st}, nil
}

func (c statesCRI) ListPodSandbox(context.Context, *runtime.ListPodSandboxRequest, ...grpc.CallOption) (*runtime.ListPodSandboxResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &runtime.ListPodSandboxResponse{Items: c.sandboxes}, nil
}

// TestCRIStates: a listing takes the state of each CRI container and
// sandbox without a task from CRI: exited with CRI's exit code and time,
// never started, not known to CRI; and where CRI still says it runs (its
// exit handler deletes the task before it records the exit) or cannot
// answer, a task of unknown status that keeps the projection's state, and
// the listing is unsure (another follows). Never an exit guessed.
func TestCRIStates(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	finished := at.Add(-3 * time.Second)
	listing := func() events.Listing {
		return events.Listing{At: at, Containers: []events.ContainerUpserted{
			{ID: "exited", CRIKind: "container"}, {ID: "window", CRIKind: "container"}, {ID: "created", CRIKind: "container"},
			{ID: "unknown-to-cri", CRIKind: "container"}, {ID: "has-task", CRIKind: "container"}, {ID: "native"},
			{ID: "sb-notready", CRIKind: "sandbox"}, {ID: "sb-ready", CRIKind: "sandbox"}, {ID: "sb-unknown", CRIKind: "sandbox"},
		}, Tasks: []events.Task{{ContainerID: "has-task", Pid: 7, Status: events.TaskRunning}}}
	}
	cri := statesCRI{states: map[string]*runtime.ContainerStatus{
		"exited":   {Id: "exited", State: runtime.ContainerState_CONTAINER_EXITED, ExitCode: 2, FinishedAt: finished.UnixNano()},
		"window":   {Id: "window", State: runtime.ContainerState_CONTAINER_RUNNING},
		"created":  {Id: "created", State: runtime.ContainerState_CONTAINER_CREATED},
		"has-task": {Id: "has-task", State: runtime.ContainerState_CONTAINER_RUNNING},
	}, sandboxes: []*runtime.PodSandbox{
		{Id: "sb-notready", State: runtime.PodSandboxState_SANDBOX_NOTREADY},
		{Id: "sb-ready", State: runtime.PodSandboxState_SANDBOX_READY},
	}}
	unavailable := status.Error(codes.Unavailable, "connection refused")
	for _, tt := range []struct {
		name   string
		cri    statesCRI
		tasks  map[string]events.Task
		unsure int
		warns  int
	}{
		{"CRI answers", cri, map[string]events.Task{
			"has-task":    {ContainerID: "has-task", Pid: 7, Status: events.TaskRunning},
			"exited":      {ContainerID: "exited", Status: events.TaskStopped, ExitStatus: 2, ExitedAt: finished},
			"window":      {ContainerID: "window", Status: events.TaskUnknown},
			"sb-notready": {ContainerID: "sb-notready", Status: events.TaskStopped, ExitedAt: at},
			"sb-ready":    {ContainerID: "sb-ready", Status: events.TaskUnknown},
		}, 2, 0},
		{"CRI fails", statesCRI{err: unavailable}, map[string]events.Task{
			"has-task":       {ContainerID: "has-task", Pid: 7, Status: events.TaskRunning},
			"exited":         {ContainerID: "exited", Status: events.TaskUnknown},
			"window":         {ContainerID: "window", Status: events.TaskUnknown},
			"created":        {ContainerID: "created", Status: events.TaskUnknown},
			"sb-notready":    {ContainerID: "sb-notready", Status: events.TaskUnknown},
			"sb-ready":       {ContainerID: "sb-ready", Status: events.TaskUnknown},
			"sb-unknown":     {ContainerID: "sb-unknown", Status: events.TaskUnknown},
			"unknown-to-cri": {ContainerID: "unknown-to-cri", Status: events.TaskUnknown},
		}, 7, 2},
		{"no CRI plugin", statesCRI{err: status.Error(codes.Unimplemented, "unknown service runtime.v1.RuntimeService")}, map[string]events.Task{
			"has-task": {ContainerID: "has-task", Pid: 7, Status: events.TaskRunning},
		}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			s := NewSource(Options{CRI: tt.cri, Log: zerolog.New(&buf)})
			l := listing()
			unsure := s.criStates(context.Background(), &l)
			got := map[string]events.Task{}
			for _, task := range l.Tasks {
				if _, dup := got[task.ContainerID]; dup {
					t.Errorf("two tasks for %s", task.ContainerID)
				}
				got[task.ContainerID] = task
			}
			for id, want := range tt.tasks {
				if g := got[id]; g.Status != want.Status || g.ExitStatus != want.ExitStatus || g.Pid != want.Pid || !g.ExitedAt.Equal(want.ExitedAt) {
					t.Errorf("%s: task %+v, want %+v", id, g, want)
				}
			}
			for id, g := range got {
				if _, ok := tt.tasks[id]; !ok {
					t.Errorf("%s: task %+v, want none", id, g)
				}
			}
			if unsure != tt.unsure {
				t.Errorf("unsure %d, want %d", unsure, tt.unsure)
			}
			if n := strings.Count(buf.String(), `"level":"warn"`); n != tt.warns {
				t.Errorf("%d warnings, want %d:\n%s", n, tt.warns, buf.String())
			}
		})
	}
}
