package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/gcagent/gcagent/events"
)

// leaseStore is the part of containerd's leases service the lock uses.
type leaseStore interface {
	Create(context.Context, ...leases.Opt) (leases.Lease, error)
	Delete(context.Context, leases.Lease, ...leases.DeleteOpt) error
	List(context.Context, ...string) ([]leases.Lease, error)
}

// labelStore is the part of containerd's namespaces service the lock
// uses: the labels of its namespace, where a release records its last
// generation, so that the next holder goes on past it and no id is ever
// made twice (a delete or create that containerd applies late would hit
// the new one).
type labelStore interface {
	Labels(ctx context.Context, namespace string) (map[string]string, error)
	SetLabel(ctx context.Context, namespace, key, value string) error
}

// LockStore is the store of NewAgentLock on a containerd client:
// LockStore{Leases: c.LeasesService(), Namespaces: c.NamespaceService()}.
type LockStore struct {
	Leases     leases.Manager
	Namespaces namespaces.Store
}

func (s LockStore) Create(ctx context.Context, o ...leases.Opt) (leases.Lease, error) {
	return s.Leases.Create(ctx, o...)
}

func (s LockStore) Delete(ctx context.Context, l leases.Lease, o ...leases.DeleteOpt) error {
	return s.Leases.Delete(ctx, l, o...)
}

func (s LockStore) List(ctx context.Context, f ...string) ([]leases.Lease, error) {
	return s.Leases.List(ctx, f...)
}

func (s LockStore) Labels(ctx context.Context, ns string) (map[string]string, error) {
	return s.Namespaces.Labels(ctx, ns)
}

func (s LockStore) SetLabel(ctx context.Context, ns, key, value string) error {
	return s.Namespaces.SetLabel(ctx, ns, key, value)
}

// lockLabelReleased, followed by a generation, is the label of the lock's
// namespace a release records (one key per release: a write containerd
// applies late cannot lower it). Its value is what lockLabelTookOver
// would say (seconds since the releaser took over, while recent), or
// releasedPlain.
const lockLabelReleased = "gcagent.io/released."

// releasedPlain is the value of a release by a holder that did not take
// over recently.
const releasedPlain = "released"

// released is what the last release recorded.
type released struct {
	last     uint64        // its generation; 0: none recorded
	tookOver bool          // the releaser took over ago before it released
	ago      time.Duration // (a value that does not parse: 0, fail closed)
	keys     []string      // the labels that record it and older ones
}

// lastReleased returns what the last release recorded (nothing without a
// label store).
func (l *AgentLock) lastReleased(ctx context.Context) (r released, err error) {
	ls, ok := l.store.(labelStore)
	if !ok {
		return released{}, nil
	}
	cctx, cancel := l.ctx(ctx)
	defer cancel()
	labels, err := ls.Labels(cctx, events.AgentNamespace)
	if err != nil && !errdefs.IsNotFound(err) {
		return released{}, fmt.Errorf("read the agent lock's last release: %w", err)
	}
	for k, v := range labels {
		if n, err := strconv.ParseUint(strings.TrimPrefix(k, lockLabelReleased), 10, 64); err == nil && strings.HasPrefix(k, lockLabelReleased) {
			if n > r.last {
				g := generation{lease: leases.Lease{Labels: map[string]string{lockLabelTookOver: v}}}
				r.last = n
				r.ago, r.tookOver = g.tookOverAgo()
				r.tookOver = r.tookOver && v != releasedPlain
			}
			r.keys = append(r.keys, k)
		}
	}
	slices.Sort(r.keys)
	return r, nil
}
