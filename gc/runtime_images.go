package gc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	adapter "github.com/gcagent/gcagent/node" // gc declares a type node in its tests
	"github.com/gcagent/gcagent/projection"
)

// ImageName is one name of an image as containerd holds it right now.
type ImageName struct {
	Name   string
	Target ocispec.Descriptor
	Labels map[string]string
}

// errImageChanged says a name moved to another target between the re-check
// and the delete: the image is not deleted, and the next pass decides anew.
var errImageChanged = errors.New("image name points at another target now")

// Image removal paths, as reported by RemoveImage.
const (
	viaCRI    = "cri"
	viaNative = "native"
)

// ImageNames returns every name that points at target digest now, sorted by
// name; none when the image is gone.
func (r Runtime) ImageNames(ctx context.Context, digest string) ([]ImageName, error) {
	imgs, err := r.Client.ImageService().List(r.ctx(ctx), "target.digest=="+strconv.Quote(digest))
	if err != nil {
		return nil, fmt.Errorf("list names of image %s: %w", digest, err)
	}
	out := make([]ImageName, 0, len(imgs))
	for _, img := range imgs {
		if img.Target.Digest.String() != digest { // the filter is the daemon's; trust but verify
			continue
		}
		out = append(out, ImageName{Name: img.Name, Target: img.Target, Labels: img.Labels})
	}
	slices.SortFunc(out, func(a, b ImageName) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ImageUsers returns what holds the image right now, sorted: containers of
// the namespace whose image is one of names and that have no rootfs
// snapshot to tell by content (or the image's chain is unknown); active or
// view snapshots
// prepared from its top layer (chain), which is every container rootfs, image
// volume and mounted view made from it whatever its name says now; and CRI
// containers whose image id is its config digest. It is the executor's
// re-check, the same rule the projection plans with.
func (r Runtime) ImageUsers(ctx context.Context, names []string, config, chain string) ([]string, error) {
	ctx = r.ctx(ctx)
	var ids []string
	if len(names) > 0 {
		filters := make([]string, len(names))
		for i, n := range names {
			filters[i] = "image==" + strconv.Quote(n)
		}
		ctrs, err := r.Client.ContainerService().List(ctx, filters...)
		if err != nil {
			return nil, fmt.Errorf("list containers of images %v: %w", names, err)
		}
		for _, c := range ctrs {
			// A container with a rootfs snapshot is matched by content below:
			// its image name may point at another image by now.
			if slices.Contains(names, c.Image) && (c.SnapshotKey == "" || chain == "") {
				ids = append(ids, c.ID)
			}
		}
	}
	if chain != "" {
		for _, sn := range r.snapshotters() {
			err := r.Client.SnapshotService(sn).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
				if info.Parent == chain && info.Kind != snapshots.KindCommitted {
					ids = append(ids, "snapshot:"+info.Name)
				}
				return nil
			}, "parent=="+strconv.Quote(chain))
			if err != nil {
				return nil, fmt.Errorf("snapshots of %s in %s: %w", chain, sn, err)
			}
		}
	}
	if config != "" && r.CRI != nil && r.criIn(ctx) {
		ctrs, err := adapter.CRIContainers(ctx, r.CRI, nil)
		if err != nil {
			return nil, fmt.Errorf("cri list containers: %w", err)
		}
		for _, c := range ctrs {
			if c.ImageRef == config || c.ImageId == config {
				ids = append(ids, c.Id)
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// snapshotters are the snapshotters whose snapshots may hold images.
func (r Runtime) snapshotters() []string {
	if len(r.Snapshotters) == 0 {
		return []string{"overlayfs"}
	}
	return r.Snapshotters
}

// LeasedContent returns the digests of the content resources held by a
// lease of the namespace now: what an in-flight pull or import is writing
// (it leases the manifest before it creates the image record). A lease that
// ends between the listing and the read of its resources is ignored.
func (r Runtime) LeasedContent(ctx context.Context) (map[string]bool, error) {
	ctx = r.ctx(ctx)
	ls := r.Client.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	held := map[string]bool{}
	for _, l := range all {
		res, err := ls.ListResources(ctx, l)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list resources of lease %s: %w", l.ID, err)
		}
		for _, rs := range res {
			if rs.Type == leaseContent {
				held[rs.ID] = true
			}
		}
	}
	return held, nil
}

// leaseContent is the lease resource type of a content blob, whose ID is
// its digest.
const leaseContent = "content"

// RemoveImage deletes every name of one image (names all point at digest)
// and reports how: "cri" when CRI manages the image and knows exactly these
// names (CRI RemoveImage by image id deletes all its references, the last
// synchronously, and keeps CRI's cache right), "native" otherwise (each name
// guarded by its target, the last one synchronously, so containerd's GC has
// freed the blobs and snapshots when it returns). Names already gone count
// as deleted. It returns an error wrapping errImageChanged when a name was
// re-pointed at another target meanwhile.
func (r Runtime) RemoveImage(ctx context.Context, digest string, names []ImageName) (string, error) {
	if len(names) == 0 {
		return viaNative, nil
	}
	via := viaNative
	if r.CRIImages != nil && r.criIn(ctx) && criManaged(names) {
		ok, err := r.removeImageCRI(ctx, names)
		if err != nil {
			return viaCRI, err
		}
		if ok {
			via = viaCRI
			// Names CRI did not know (a name created natively since) remain.
			left, err := r.ImageNames(ctx, digest)
			if err != nil {
				return via, err
			}
			names = left
		}
	}
	return via, r.removeImageNative(ctx, digest, names)
}

func criManaged(names []ImageName) bool {
	for _, n := range names {
		if n.Labels[projection.LabelCRIManaged] != "" {
			return true
		}
	}
	return false
}

// removeImageCRI removes the image through CRI if CRI's view of it is
// exactly these names: CRI groups images by config digest, so another target
// with the same config would lose its names too. It reports false (and does
// nothing) when CRI does not know the image or knows other names for it.
func (r Runtime) removeImageCRI(ctx context.Context, names []ImageName) (bool, error) {
	id := names[0].Name
	for _, n := range names {
		if strings.HasPrefix(n.Name, "sha256:") { // CRI's image id ref
			id = n.Name
			break
		}
	}
	spec := &runtime.ImageSpec{Image: id}
	st, err := r.CRIImages.ImageStatus(ctx, &runtime.ImageStatusRequest{Image: spec})
	if err != nil {
		return false, fmt.Errorf("cri image status %q: %w", id, err)
	}
	if st.GetImage() == nil {
		return false, nil
	}
	own := make(map[string]bool, len(names))
	for _, n := range names {
		own[n.Name] = true
	}
	for _, ref := range append(slices.Clone(st.Image.RepoTags), st.Image.RepoDigests...) {
		if !own[ref] {
			return false, nil
		}
	}
	if _, err := r.CRIImages.RemoveImage(ctx, &runtime.RemoveImageRequest{Image: spec}); err != nil {
		if status.Code(err) == codes.NotFound {
			return true, nil
		}
		return true, fmt.Errorf("cri remove image %q: %w", id, err)
	}
	return true, nil
}

// removeImageNative deletes each name guarded by the target: a 2.x daemon
// honours DeleteTarget; a 1.x daemon ignores it, so each name is read back
// first and compared (a window of one round trip remains there).
func (r Runtime) removeImageNative(ctx context.Context, digest string, names []ImageName) error {
	ctx = r.ctx(ctx)
	is := r.Client.ImageService()
	for i, n := range names {
		cur, err := is.Get(ctx, n.Name)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("get image %q: %w", n.Name, err)
		}
		if cur.Target.Digest.String() != digest {
			return fmt.Errorf("image %q: %w (%s)", n.Name, errImageChanged, cur.Target.Digest)
		}
		target := cur.Target
		opts := []images.DeleteOpt{images.DeleteTarget(&target)}
		if i == len(names)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		err = is.Delete(ctx, n.Name, opts...)
		if errdefs.IsNotFound(err) {
			// Gone, or (2.x) re-pointed since the Get: tell them apart.
			if cur, gerr := is.Get(ctx, n.Name); gerr == nil && cur.Target.Digest.String() != digest {
				return fmt.Errorf("image %q: %w (%s)", n.Name, errImageChanged, cur.Target.Digest)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("delete image %q: %w", n.Name, err)
		}
	}
	return nil
}

// SandboxImages asks CRI which sandbox (pause) images it is configured with:
// RuntimeService.Status with verbose set returns CRI's config as JSON, which
// names it "sandboxImage" on containerd 1.x. Where a daemon reports pinned
// images ("pinnedImages", e.g. {"sandbox": ...}) those count too; 2.x keeps
// them out of Status but labels them pinned instead. It returns none, without
// error, when the config does not say.
func (r Runtime) SandboxImages(ctx context.Context) ([]string, error) {
	if r.CRI == nil {
		return nil, nil
	}
	resp, err := r.CRI.Status(ctx, &runtime.StatusRequest{Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("cri status: %w", err)
	}
	return sandboxImagesFromConfig(resp.GetInfo()["config"]), nil
}

// sandboxImagesFromConfig finds sandbox and pinned image names anywhere in
// CRI's config JSON, sorted and without duplicates.
func sandboxImagesFromConfig(config string) []string {
	var doc any
	if config == "" || json.Unmarshal([]byte(config), &doc) != nil {
		return nil
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, val := range v {
				switch strings.ToLower(strings.ReplaceAll(k, "_", "")) {
				case "sandboximage":
					if s, ok := val.(string); ok && s != "" {
						out = append(out, s)
					}
				case "pinnedimages":
					if m, ok := val.(map[string]any); ok {
						for _, p := range m {
							if s, ok := p.(string); ok && s != "" {
								out = append(out, s)
							}
						}
					}
				default:
					walk(val)
				}
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	slices.Sort(out)
	return slices.Compact(out)
}

// Statfs measures the filesystem that holds Path, as the kubelet's image
// filesystem stats do: capacity from the block count, available to
// unprivileged users.
type Statfs struct{ Path string }

// Disk returns the filesystem's capacity and available bytes.
func (f Statfs) Disk() (DiskStats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.Path, &st); err != nil {
		return DiskStats{}, fmt.Errorf("statfs %s: %w", f.Path, err)
	}
	bs := uint64(st.Bsize)
	return DiskStats{CapacityBytes: st.Blocks * bs, AvailableBytes: st.Bavail * bs}, nil
}
