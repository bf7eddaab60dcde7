package gc

import (
	"context"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is the node's containerd and its CRI plugin: the concrete side of
// the executors' small interfaces. CRI-managed objects are deleted through
// CRI so that CRI keeps no stale state; everything else through containerd.
type Runtime struct {
	Client    *client.Client
	CRI       runtime.RuntimeServiceClient
	CRIImages runtime.ImageServiceClient
	Namespace string
	// Snapshotters hold the snapshots that keep images in use; default
	// overlayfs.
	Snapshotters []string
}

// ctx puts the runtime's namespace on ctx (containerd calls need one; CRI
// ignores it).
func (r Runtime) ctx(ctx context.Context) context.Context {
	if r.Namespace == "" {
		return ctx
	}
	return namespaces.WithNamespace(ctx, r.Namespace)
}
