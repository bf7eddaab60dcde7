// Package node is the node adapter: the only code that talks to containerd
// and CRI. It dials them, follows containerd's events, lists and looks up
// objects, answers "is this image in use right now?" for the projection and
// for the re-check right before a delete, deletes, measures the image
// filesystem and tells whether the object of a delete intent is gone. The
// packages that decide (projection, gc, logs) declare the small interfaces
// it implements and link none of containerd, gRPC or CRI. See
// docs/architecture.md.
package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
)

// Runtime is the node's containerd and its CRI plugin: the concrete side of
// the executors' small interfaces. CRI-managed objects are deleted through
// CRI so that CRI keeps no stale state; everything else through containerd.
// Every call names the containerd namespace it acts in. A Runtime is safe
// for concurrent use; copy it only before its first call.
type Runtime struct {
	Client    *client.Client
	CRI       runtime.RuntimeServiceClient
	CRIImages runtime.ImageServiceClient
	// Nerdctl cleans, after their delete, the state nerdctl keeps outside
	// containerd for the containers it made; its DataRoot is
	// --nerdctl-data-root (empty: /var/lib/nerdctl).
	Nerdctl Nerdctl
	// StampSkew, for end-to-end tests only (as Options.StampSkew), is
	// added to the containers' creation times it reads, so that they
	// compare with the projection's; nil in production.
	StampSkew func(time.Time) time.Duration

	sn *snapshotterCache
}

// created is a container's creation time as the projection records it:
// containerd's stamp in UTC, plus the test-only StampSkew.
func (r *Runtime) created(t time.Time) time.Time {
	if r.StampSkew == nil || t.IsZero() {
		return t.UTC()
	}
	return t.Add(r.StampSkew(t)).UTC()
}

// NewRuntime returns a Runtime of cl and, when CRI answers on the same
// socket, its CRI services (nil conn: no CRI).
func NewRuntime(cl *client.Client, cri runtime.RuntimeServiceClient, images runtime.ImageServiceClient) *Runtime {
	return &Runtime{Client: cl, CRI: cri, CRIImages: images, sn: &snapshotterCache{}}
}

// in puts containerd namespace ns on ctx.
func in(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}

// criIn reports whether CRI may be asked about, or act on, namespace ns:
// CRI keeps its pods, containers and images in CRI's namespace only, and
// its labels mean nothing elsewhere.
func criIn(ns string) bool { return ns == events.CRINamespace }

// snapshotterType is the plugin type of containerd's snapshotters.
const snapshotterType = "io.containerd.snapshotter.v1"

// snapshotterTTL is how long the list of snapshotters is trusted: a
// daemon loads its plugins when it starts.
const snapshotterTTL = time.Minute

type snapshotterCache struct {
	mu   sync.Mutex
	at   time.Time
	list []string
}

// Snapshotters returns the snapshotters containerd runs (loaded without
// error), asked through its introspection service and cached for a
// minute. Any of them may hold a container's rootfs or an image volume.
func (r *Runtime) Snapshotters(ctx context.Context) ([]string, error) {
	c := r.sn
	if c == nil {
		c = &snapshotterCache{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.list != nil && time.Since(c.at) < snapshotterTTL {
		return c.list, nil
	}
	resp, err := r.Client.IntrospectionService().Plugins(ctx, "type=="+snapshotterType)
	if err != nil {
		return nil, fmt.Errorf("ask containerd which snapshotters it runs: %w", err)
	}
	var list []string
	for _, p := range resp.GetPlugins() {
		if p.GetType() == snapshotterType && p.GetInitErr() == nil {
			list = append(list, p.GetID())
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("containerd runs no snapshotter")
	}
	slices.Sort(list)
	c.list, c.at = list, time.Now()
	return list, nil
}

// ctrNotFound reports a NotFound from containerd or from a raw CRI call.
func ctrNotFound(err error) bool {
	return err != nil && (errdefs.IsNotFound(err) || status.Code(err) == codes.NotFound)
}
