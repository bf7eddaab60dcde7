package node

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
)

var _ interface {
	NativeLiveness(ctx context.Context, ns, id string) (gc.Liveness, error)
	DeleteNative(ctx context.Context, ns, id string) (gc.OwnerCleanup, error)
	CRIContainerLiveness(ctx context.Context, id string) (gc.Liveness, error)
	RemoveCRIContainer(ctx context.Context, id string) error
	CRISandboxLiveness(ctx context.Context, id string) (gc.Liveness, error)
	RemoveCRISandbox(ctx context.Context, id string) error
} = (*Runtime)(nil)

// NativeLiveness re-reads the task of plain container id from containerd. A
// container without a task counts as dead: the caller asks only about
// containers the projection saw exit, and a new run would have a task. A
// dead container that must be kept for its owner's state (see ownerKeeps)
// is reported with a *gc.Kept error.
func (r *Runtime) NativeLiveness(ctx context.Context, ns, id string) (gc.Liveness, error) {
	ctx = in(ctx, ns)
	ctr, err := r.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return gc.LiveGone, nil
	}
	if err != nil {
		return "", fmt.Errorf("load container %q: %w", id, err)
	}
	info, err := ctr.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return "", fmt.Errorf("read container %q: %w", id, err)
	}
	if info.SnapshotKey != "" {
		held, err := r.leasedSnapshot(ctx, info.Snapshotter, info.SnapshotKey)
		if err != nil {
			return "", err
		}
		if held {
			return gc.LiveLeased, nil
		}
	}
	dead := func() (gc.Liveness, error) {
		if err := r.ownerKeeps(ns, id, info.Labels); err != nil {
			return "", err
		}
		return gc.LiveDead, nil
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return dead()
	}
	if err != nil {
		return "", fmt.Errorf("task of container %q: %w", id, err)
	}
	st, err := task.Status(ctx)
	if errdefs.IsNotFound(err) {
		return dead()
	}
	if err != nil {
		return "", fmt.Errorf("task status of container %q: %w", id, err)
	}
	switch st.Status {
	case client.Stopped:
		return dead()
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
// task, then the container with its snapshot, then, for a container made
// by nerdctl, the state nerdctl keeps for it (Runtime.Nerdctl.Cleanup),
// and returns what of that state it removed. It never kills: containerd
// refuses to delete a task that runs again, and that error is returned. A
// container already gone, or a task or container that vanishes between our
// reads and our delete, means its owner deleted it first: gc.ErrOwnerWon,
// never our removal. Labels that now keep it (see ownerKeeps) fail the
// delete before anything is deleted. Once the container is deleted the
// error is nil: a cleanup that failed is reported in the result's Error.
func (r *Runtime) DeleteNative(ctx context.Context, ns, id string) (gc.OwnerCleanup, error) {
	ctx = in(ctx, ns)
	ctr, err := r.Client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return gc.OwnerCleanup{}, gc.ErrOwnerWon
	}
	if err != nil {
		return gc.OwnerCleanup{}, fmt.Errorf("load container %q: %w", id, err)
	}
	info, err := ctr.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return gc.OwnerCleanup{}, fmt.Errorf("read container %q: %w", id, err)
	}
	// The labels the delete goes by are those read now: they may have
	// changed since the re-check.
	if err := r.ownerKeeps(ns, id, info.Labels); err != nil {
		return gc.OwnerCleanup{}, fmt.Errorf("container %q not deleted: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx); err != nil {
			if errdefs.IsNotFound(err) {
				return gc.OwnerCleanup{}, gc.ErrOwnerWon
			}
			return gc.OwnerCleanup{}, fmt.Errorf("delete task of container %q: %w", id, err)
		}
	case !errdefs.IsNotFound(err):
		return gc.OwnerCleanup{}, fmt.Errorf("task of container %q: %w", id, err)
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsConflict(err) {
			return gc.OwnerCleanup{}, gc.ErrOwnerWon
		}
		return gc.OwnerCleanup{}, fmt.Errorf("delete container %q: %w", id, err)
	}
	return r.cleanOwner(ctx, ns, id, info.Labels), nil
}

// ownerKeeps returns a *gc.Kept when container ns/id must not be deleted
// although it is dead, judged from its labels (no I/O): a restart policy
// wants it running (gc.LiveRestartManaged), or it was made by nerdctl and
// holds state Nerdctl.Cleanup does not free, or its labels do not fit
// nerdctl's layout under Runtime.Nerdctl's data root, so that its state
// could not be cleaned after the delete (gc.LiveOwnerState).
func (r *Runtime) ownerKeeps(ns, id string, labels map[string]string) error {
	if why, keep := NerdctlKeep(labels); keep {
		if why == NerdctlKeepRestartManaged {
			return &gc.Kept{Live: gc.LiveRestartManaged, Why: why}
		}
		return &gc.Kept{Live: gc.LiveOwnerState, Why: why}
	}
	if err := r.Nerdctl.Check(ns, id, labels); err != nil {
		return &gc.Kept{Live: gc.LiveOwnerState, Why: err.Error()}
	}
	return nil
}

// nerdctlCleanupWait bounds the wait for nerdctl's locks in the cleanup
// after a delete.
const nerdctlCleanupWait = 10 * time.Second

// cleanOwner removes the nerdctl state of container ns/id, which was just
// deleted, if it has any (label nerdctl/state-dir). It runs to its end
// even when ctx is canceled (the container is gone: its state must not
// be left), waiting at most nerdctlCleanupWait for nerdctl's locks.
func (r *Runtime) cleanOwner(ctx context.Context, ns, id string, labels map[string]string) gc.OwnerCleanup {
	if _, ok := labels[nerdctlLabelStateDir]; !ok {
		return gc.OwnerCleanup{}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nerdctlCleanupWait)
	defer cancel()
	c, err := r.Nerdctl.Cleanup(ctx, ns, id, labels)
	o := gc.OwnerCleanup{Owner: "nerdctl", Removed: c.Removed, Bytes: c.Bytes, NameHeldBy: c.NameHeldBy}
	if err != nil {
		o.Error = err.Error()
	}
	return o
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

// CRIContainerLogPath is container id's log path in CRI's status (its
// sandbox's log directory joined with its own log path; empty when it has
// none); gc.ErrContainerGone when CRI does not know it.
func (r *Runtime) CRIContainerLogPath(ctx context.Context, id string) (string, error) {
	ctx = in(ctx, events.CRINamespace)
	resp, err := r.CRI.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
	if ctrNotFound(err) {
		return "", gc.ErrContainerGone
	}
	if err != nil {
		return "", fmt.Errorf("cri container status %q: %w", id, err)
	}
	return resp.GetStatus().GetLogPath(), nil
}

// RemoveCRIContainer removes container id through CRI, so that CRI keeps no
// stale entry. Call it only for an exited container: CRI force-stops a
// running one. NotFound is success (CRI itself answers a remove of a
// container it does not know with success, so a kubelet's remove in the
// round trip since the re-check cannot be told from ours).
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
