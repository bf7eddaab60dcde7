package gc

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Liveness is what the runtime says of a container right before it would
// be deleted. Only LiveDead may be deleted; LiveGone needs nothing.
type Liveness string

// Liveness values; all but LiveGone and LiveDead keep the container, and
// serve as the reason it was kept.
const (
	LiveGone          Liveness = "gone"           // not found: already deleted
	LiveDead          Liveness = "dead"           // task stopped or deleted after its exit; CRI exited; sandbox not ready and empty
	LiveRunning       Liveness = "running"        // task running or paused; CRI running; sandbox ready
	LiveCreated       Liveness = "created"        // task or CRI container created, not started
	LiveUnknown       Liveness = "unknown"        // the runtime cannot tell
	LiveHasContainers Liveness = "has-containers" // a sandbox that still holds containers
	LiveLeased        Liveness = "leased"         // a containerd lease (a client at work) holds its snapshot
)

// errOwnerWon says the container's owner deleted it (or its task) between
// the re-check and our delete: not an error, the owner was first.
var errOwnerWon = errors.New("owner deleted it first")

// NativeLiveness re-reads the task of plain container id from containerd. A
// container without a task counts as dead: the caller asks only about
// containers the projection saw exit, and a new run would have a task.
func (r Runtime) NativeLiveness(ctx context.Context, id string) (Liveness, error) {
	ctx = r.ctx(ctx)
	ctr, err := r.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("load container %q: %w", id, err)
	}
	if info, err := ctr.Info(ctx, client.WithoutRefreshedMetadata); err == nil && info.SnapshotKey != "" {
		held, err := r.leasedSnapshot(ctx, info.Snapshotter, info.SnapshotKey)
		if err != nil {
			return "", err
		}
		if held {
			return LiveLeased, nil
		}
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return LiveDead, nil
	}
	if err != nil {
		return "", fmt.Errorf("task of container %q: %w", id, err)
	}
	st, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return LiveDead, nil
	}
	if err != nil {
		return "", fmt.Errorf("task status of container %q: %w", id, err)
	}
	switch st.Status {
	case client.Stopped:
		return LiveDead, nil
	case client.Running, client.Paused, client.Pausing:
		return LiveRunning, nil
	case client.Created:
		return LiveCreated, nil
	}
	return LiveUnknown, nil
}

// leasedSnapshot reports whether a lease of the namespace holds the
// snapshot key of snapshotter sn: a client (ctr run, a build) is at work.
func (r Runtime) leasedSnapshot(ctx context.Context, sn, key string) (bool, error) {
	if sn == "" {
		sn = "overlayfs"
	}
	ls := r.Client.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return false, fmt.Errorf("list leases: %w", err)
	}
	for _, l := range all {
		res, err := ls.ListResources(ctx, l)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("list resources of lease %s: %w", l.ID, err)
		}
		for _, rs := range res {
			if rs.Type == "snapshots/"+sn && rs.ID == key {
				return true, nil
			}
		}
	}
	return false, nil
}

// DeleteNative deletes plain container id through containerd: its stopped
// task, then the container with its snapshot. It never kills: containerd
// refuses to delete a task that runs again, and that error is returned. A
// container already gone is success; a task or container that vanishes
// between our reads and our delete means its owner deleted it first, and
// returns errOwnerWon.
func (r Runtime) DeleteNative(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	ctr, err := r.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load container %q: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx); err != nil {
			if errdefs.IsNotFound(err) {
				return errOwnerWon
			}
			return fmt.Errorf("delete task of container %q: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("task of container %q: %w", id, err)
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsConflict(err) {
			return errOwnerWon
		}
		return fmt.Errorf("delete container %q: %w", id, err)
	}
	return nil
}

// CRIContainerLiveness asks CRI for the state of container id.
func (r Runtime) CRIContainerLiveness(ctx context.Context, id string) (Liveness, error) {
	resp, err := r.CRI.ContainerStatus(r.ctx(ctx), &runtime.ContainerStatusRequest{ContainerId: id})
	if ctrNotFound(err) {
		return LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("cri container status %q: %w", id, err)
	}
	if resp.GetStatus() == nil {
		return LiveUnknown, nil
	}
	switch resp.Status.State {
	case runtime.ContainerState_CONTAINER_EXITED:
		return LiveDead, nil
	case runtime.ContainerState_CONTAINER_RUNNING:
		return LiveRunning, nil
	case runtime.ContainerState_CONTAINER_CREATED:
		return LiveCreated, nil
	}
	return LiveUnknown, nil
}

// RemoveCRIContainer removes container id through CRI, so that CRI keeps no
// stale entry. Call it only for an exited container: CRI force-stops a
// running one. NotFound is success.
func (r Runtime) RemoveCRIContainer(ctx context.Context, id string) error {
	_, err := r.CRI.RemoveContainer(r.ctx(ctx), &runtime.RemoveContainerRequest{ContainerId: id})
	if err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri remove container %q: %w", id, err)
	}
	return nil
}

// CRISandboxLiveness asks CRI whether sandbox id may go: it must not be
// ready and must hold no container, in any state (CRI's RemovePodSandbox
// would remove them along).
func (r Runtime) CRISandboxLiveness(ctx context.Context, id string) (Liveness, error) {
	ctx = r.ctx(ctx)
	resp, err := r.CRI.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: id})
	if ctrNotFound(err) {
		return LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("cri sandbox status %q: %w", id, err)
	}
	if resp.GetStatus() == nil {
		return LiveUnknown, nil
	}
	if resp.Status.State == runtime.PodSandboxState_SANDBOX_READY {
		return LiveRunning, nil
	}
	ctrs, err := r.CRI.ListContainers(ctx, &runtime.ListContainersRequest{
		Filter: &runtime.ContainerFilter{PodSandboxId: id},
	})
	if err != nil {
		return "", fmt.Errorf("cri containers of sandbox %q: %w", id, err)
	}
	for _, c := range ctrs.Containers {
		if c.PodSandboxId == id {
			return LiveHasContainers, nil
		}
	}
	return LiveDead, nil
}

// RemoveCRISandbox stops sandbox id (which releases its network and mounts)
// and removes it, both through CRI. NotFound is success.
func (r Runtime) RemoveCRISandbox(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	if _, err := r.CRI.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: id}); err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri stop sandbox %q: %w", id, err)
	}
	if _, err := r.CRI.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri remove sandbox %q: %w", id, err)
	}
	return nil
}

// ctrNotFound reports a NotFound from containerd or from a raw CRI call.
func ctrNotFound(err error) bool {
	return err != nil && (errdefs.IsNotFound(err) || status.Code(err) == codes.NotFound)
}
