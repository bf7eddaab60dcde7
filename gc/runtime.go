package gc

import (
	"context"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/gcagent/gcagent/events"
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
// ignores it). Without one, the namespace is the caller's: the executors
// put each item's on the context (inNamespace).
func (r Runtime) ctx(ctx context.Context) context.Context {
	if r.Namespace == "" {
		return ctx
	}
	return namespaces.WithNamespace(ctx, r.Namespace)
}

// criIn reports whether CRI may be asked about, or act on, ctx's
// namespace: CRI keeps its pods, containers and images in CRI's namespace
// only, and its labels mean nothing elsewhere.
func (r Runtime) criIn(ctx context.Context) bool {
	ns, _ := namespaces.Namespace(r.ctx(ctx))
	return ns == events.CRINamespace
}

// inNamespace puts containerd namespace ns on ctx; "" leaves ctx as it is
// (a Runtime with its own Namespace, or a test).
func inNamespace(ctx context.Context, ns string) context.Context {
	if ns == "" {
		return ctx
	}
	return namespaces.WithNamespace(ctx, ns)
}

// scopedKey prefixes an event key with a namespace other than CRI's, so
// the same object in two namespaces gets two keys; CRI's keep the keys
// they had before namespaces were managed.
func scopedKey(ns, key string) string {
	if ns == "" || ns == events.CRINamespace {
		return key
	}
	return ns + "/" + key
}
