package node

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/gcagent/gcagent/gc"
)

// ImageHolders answers "is this image in use right now?" in namespace ns,
// the question the projection's index answers from events, asked again
// right before a delete. What holds img, sorted:
//   - every active or view snapshot, on every snapshotter containerd runs,
//     whose nearest image ancestor is img's top layer: container rootfs
//     snapshots (remapped ones, whose parent is a chowned copy of the top
//     layer, included), image volumes and mounted views;
//   - containers without a rootfs snapshot that name one of img's names;
//   - in CRI's namespace, CRI containers whose image id is img's config
//     digest;
//   - leases that hold img's target: a pull or import writing it, read now.
func (r *Runtime) ImageHolders(ctx context.Context, ns string, img gc.ImageRef) ([]gc.Holder, error) {
	ctx = in(ctx, ns)
	var out []gc.Holder
	if len(img.Names) > 0 {
		filters := make([]string, len(img.Names))
		for i, n := range img.Names {
			filters[i] = "image==" + strconv.Quote(n)
		}
		ctrs, err := r.Client.ContainerService().List(ctx, filters...)
		if err != nil {
			return nil, fmt.Errorf("list containers of images %v: %w", img.Names, err)
		}
		for _, c := range ctrs {
			// A container with a rootfs snapshot is matched by content
			// below: its image name may point at another image by now.
			if slices.Contains(img.Names, c.Image) && (c.SnapshotKey == "" || img.Chain == "") {
				out = append(out, gc.Holder{Kind: gc.HolderContainer, ID: c.ID})
			}
		}
	}
	if img.Chain != "" {
		sns, err := r.Snapshotters(ctx)
		if err != nil {
			return nil, err
		}
		// Asked afresh at each re-check: an image deleted since is no
		// top any more, and its snapshots lead down to the next one.
		tops := newImageTops(r.Client.ContentStore())
		for _, sn := range sns {
			users, err := r.snapshotUsers(ctx, tops, sn, img.Chain)
			if err != nil {
				return nil, err
			}
			out = append(out, users...)
		}
	}
	if img.Config != "" && r.CRI != nil && criIn(ns) {
		ctrs, err := CRIContainers(ctx, r.CRI, nil)
		if err != nil {
			return nil, fmt.Errorf("cri list containers: %w", err)
		}
		for _, c := range ctrs {
			if c.ImageRef == img.Config || c.ImageId == img.Config {
				out = append(out, gc.Holder{Kind: gc.HolderCRI, ID: c.Id})
			}
		}
	}
	leases, err := r.leasesOf(ctx, img.Digest)
	if err != nil {
		return nil, err
	}
	out = append(out, leases...)
	slices.SortFunc(out, func(a, b gc.Holder) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.ID, b.ID))
	})
	return slices.Compact(out), nil
}

// snapshotUsers returns the active and view snapshots of snapshotter sn
// that descend from chain without passing another image's top layer:
// breadth first through chain's children, down through committed
// snapshots that are no image's top (a remapped copy), never into one that
// is (a derived image's layer: its containers use that image, not this).
func (r *Runtime) snapshotUsers(ctx context.Context, tops *imageTops, sn, chain string) ([]gc.Holder, error) {
	ss := r.Client.SnapshotService(sn)
	var out []gc.Holder
	level := []string{chain}
	seen := map[string]bool{chain: true}
	for depth := 0; len(level) > 0 && depth < maxAncestry; depth++ {
		var next []string
		for _, parent := range level {
			err := ss.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
				if info.Parent != parent || seen[info.Name] {
					return nil
				}
				seen[info.Name] = true
				if info.Kind != snapshots.KindCommitted {
					out = append(out, gc.Holder{Kind: gc.HolderSnapshot, ID: sn + "/" + info.Name})
					return nil
				}
				next = append(next, info.Name)
				return nil
			}, "parent=="+strconv.Quote(parent))
			if err != nil {
				return nil, fmt.Errorf("snapshots of %s in %s: %w", parent, sn, err)
			}
		}
		// Committed children are followed only when they are no image's
		// top layer.
		level = level[:0]
		for _, c := range next {
			top, err := tops.imageTop(ctx, sn, c)
			if err != nil {
				return nil, err
			}
			if !top {
				level = append(level, c)
			}
		}
	}
	return out, nil
}

// leaseContent is the lease resource type of a content blob, whose ID is
// its digest.
const leaseContent = "content"

// leasesOf returns the leases of ctx's namespace that hold content digest
// now. A lease that ends between the listing and the read of its
// resources is ignored.
func (r *Runtime) leasesOf(ctx context.Context, digest string) ([]gc.Holder, error) {
	ls := r.Client.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	var out []gc.Holder
	for _, l := range all {
		res, err := ls.ListResources(ctx, l)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list resources of lease %s: %w", l.ID, err)
		}
		for _, rs := range res {
			if rs.Type == leaseContent && rs.ID == digest {
				out = append(out, gc.Holder{Kind: gc.HolderLease, ID: l.ID})
				break
			}
		}
	}
	return out, nil
}
