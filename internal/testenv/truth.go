package testenv

import (
	"context"
	"slices"
	"testing"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Truth is the namespace as containerd and CRI report it, read without any
// gcagent code, for comparison with the agent's projection.
type Truth struct {
	Images     map[string][]string       // target digest -> sorted names
	Containers map[string]TruthContainer // by id
	LivePods   []string                  // sorted uids of pods with a sandbox
}

// TruthContainer is one container's ground truth.
type TruthContainer struct {
	Image      string
	Kind       string // sandbox, container, native
	State      string // running, exited, created; no-task for a native container without one
	ExitStatus uint32
}

// Truth lists the daemon (and CRI for CRI containers, whose exited tasks
// CRI deletes) into a Truth.
func (c *Containerd) Truth(t testing.TB) Truth {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.Ctx(), 30*time.Second)
	defer cancel()
	tr := Truth{Images: map[string][]string{}, Containers: map[string]TruthContainer{}, LivePods: []string{}}
	imgs, err := c.Client.ImageService().List(ctx)
	if err != nil {
		t.Fatalf("truth: images: %v", err)
	}
	for _, img := range imgs {
		d := img.Target.Digest.String()
		tr.Images[d] = append(tr.Images[d], img.Name)
	}
	for d := range tr.Images {
		slices.Sort(tr.Images[d])
	}
	tasks, err := c.Client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		t.Fatalf("truth: tasks: %v", err)
	}
	byID := map[string]*tasktypes.Process{}
	for _, p := range tasks.Tasks {
		id := p.ContainerID
		if id == "" {
			id = p.ID
		}
		byID[id] = p
	}
	rt, _ := c.CRI(t)
	criState := map[string]runtime.ContainerState{}
	if resp, err := rt.ListContainers(ctx, &runtime.ListContainersRequest{}); err == nil {
		for _, ct := range resp.Containers {
			criState[ct.Id] = ct.State
		}
	}
	criExit := func(id string) uint32 {
		resp, err := rt.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil || resp.Status == nil {
			return 0
		}
		return uint32(resp.Status.ExitCode)
	}
	ctrs, err := c.Client.ContainerService().List(ctx)
	if err != nil {
		t.Fatalf("truth: containers: %v", err)
	}
	pods := map[string]bool{}
	for _, ct := range ctrs {
		tc := TruthContainer{Image: ct.Image, Kind: ct.Labels["io.cri-containerd.kind"], State: "created"}
		if tc.Kind == "" {
			tc.Kind = "native"
		}
		if tc.Kind == "sandbox" {
			pods[ct.Labels["io.kubernetes.pod.uid"]] = true
		}
		if p := byID[ct.ID]; p != nil {
			switch p.Status {
			case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED:
				tc.State = "running"
			case tasktypes.Status_STOPPED:
				tc.State, tc.ExitStatus = "exited", p.ExitStatus
			}
		} else if tc.Kind == "container" && criState[ct.ID] == runtime.ContainerState_CONTAINER_EXITED {
			tc.State, tc.ExitStatus = "exited", criExit(ct.ID)
		} else if tc.Kind == "sandbox" {
			tc.State = "exited" // CRI deletes a stopped sandbox's task
		} else if tc.Kind == "native" {
			tc.State = "no-task"
		}
		tr.Containers[ct.ID] = tc
	}
	for uid := range pods {
		tr.LivePods = append(tr.LivePods, uid)
	}
	slices.Sort(tr.LivePods)
	return tr
}
