package node

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
)

var _ interface {
	NativeLiveness(ctx context.Context, ns, id string) (gc.Liveness, error)
	DeleteNative(ctx context.Context, ns, id string) error
	CRIContainerLiveness(ctx context.Context, id string) (gc.Liveness, error)
	RemoveCRIContainer(ctx context.Context, id string) error
	CRISandboxLiveness(ctx context.Context, id string) (gc.Liveness, error)
	RemoveCRISandbox(ctx context.Context, id string) error
} = (*Runtime)(nil)

// NativeLiveness re-reads the task of plain container id from containerd. A
// container without a task counts as dead: the caller asks only about
// containers the projection saw exit, and a new run would have a task.
func (r *Runtime) NativeLiveness(ctx context.Context, ns, id string) (gc.Liveness, error) {
	ctx = in(ctx, ns)
	ctr, err := r.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return gc.LiveGone, nil
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
			return gc.LiveLeased, nil
		}
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return gc.LiveDead, nil
	}
	if err != nil {
		return "", fmt.Errorf("task of container %q: %w", id, err)
	}
	st, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return gc.LiveDead, nil
	}
	if err != nil {
		return "", fmt.Errorf("task status of container %q: %w", id, err)
	}
	switch st.Status {
	case client.Stopped:
		return gc.LiveDead, nil
	case client.Running, client.Paused, client.Pausing:
		return gc.LiveRunning, nil
	case client.Created:
		return gc.LiveCreated, nil
	}
	return gc.LiveUnknown, nil
}

// leasedSnapshot reports whether a lease of the namespace holds the
// snapshot key of snapshotter sn: a client (ctr run, a build) is at work.
func (r *Runtime) leasedSnapshot(ctx context.Context, sn, key string) (bool, error) {
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
func (r *Runtime) DeleteNative(ctx context.Context, ns, id string) error {
	ctx = in(ctx, ns)
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
				return gc.ErrOwnerWon
			}
			return fmt.Errorf("delete task of container %q: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("task of container %q: %w", id, err)
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsConflict(err) {
			return gc.ErrOwnerWon
		}
		return fmt.Errorf("delete container %q: %w", id, err)
	}
	return nil
}

// CRIContainerLiveness asks CRI for the state of container id.
func (r *Runtime) CRIContainerLiveness(ctx context.Context, id string) (gc.Liveness, error) {
	ctx = in(ctx, events.CRINamespace)
	resp, err := r.CRI.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
	if ctrNotFound(err) {
		return gc.LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("cri container status %q: %w", id, err)
	}
	if resp.GetStatus() == nil {
		return gc.LiveUnknown, nil
	}
	switch resp.Status.State {
	case runtime.ContainerState_CONTAINER_EXITED:
		return gc.LiveDead, nil
	case runtime.ContainerState_CONTAINER_RUNNING:
		return gc.LiveRunning, nil
	case runtime.ContainerState_CONTAINER_CREATED:
		return gc.LiveCreated, nil
	}
	return gc.LiveUnknown, nil
}

// RemoveCRIContainer removes container id through CRI, so that CRI keeps no
// stale entry. Call it only for an exited container: CRI force-stops a
// running one. NotFound is success.
func (r *Runtime) RemoveCRIContainer(ctx context.Context, id string) error {
	ctx = in(ctx, events.CRINamespace)
	_, err := r.CRI.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id})
	if err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri remove container %q: %w", id, err)
	}
	return nil
}

// CRISandboxLiveness asks CRI whether sandbox id may go: it must not be
// ready and must hold no container, in any state (CRI's RemovePodSandbox
// would remove them along).
func (r *Runtime) CRISandboxLiveness(ctx context.Context, id string) (gc.Liveness, error) {
	ctx = in(ctx, events.CRINamespace)
	resp, err := r.CRI.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: id})
	if ctrNotFound(err) {
		return gc.LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("cri sandbox status %q: %w", id, err)
	}
	if resp.GetStatus() == nil {
		return gc.LiveUnknown, nil
	}
	if resp.Status.State == runtime.PodSandboxState_SANDBOX_READY {
		return gc.LiveRunning, nil
	}
	ctrs, err := r.CRI.ListContainers(ctx, &runtime.ListContainersRequest{
		Filter: &runtime.ContainerFilter{PodSandboxId: id},
	})
	if err != nil {
		return "", fmt.Errorf("cri containers of sandbox %q: %w", id, err)
	}
	for _, c := range ctrs.Containers {
		if c.PodSandboxId == id {
			return gc.LiveHasContainers, nil
		}
	}
	return gc.LiveDead, nil
}

// RemoveCRISandbox stops sandbox id (which releases its network and mounts)
// and removes it, both through CRI. NotFound is success.
func (r *Runtime) RemoveCRISandbox(ctx context.Context, id string) error {
	ctx = in(ctx, events.CRINamespace)
	if _, err := r.CRI.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: id}); err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri stop sandbox %q: %w", id, err)
	}
	if _, err := r.CRI.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && !ctrNotFound(err) {
		return fmt.Errorf("cri remove sandbox %q: %w", id, err)
	}
	return nil
}
