package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/projection"
)

// Image removal paths, as reported by RemoveImage.
const (
	viaCRI    = "cri"
	viaNative = "native"
)

var _ interface {
	ImageNames(ctx context.Context, ns, digest string) ([]gc.ImageName, error)
	ImageHolders(ctx context.Context, ns string, img gc.ImageRef) ([]gc.Holder, error)
	RemoveImage(ctx context.Context, ns, digest string, names []gc.ImageName) (string, error)
} = (*Runtime)(nil)

// ImageNames returns every name of namespace ns that points at target
// digest now, sorted by name, each with its labels and its record's
// creation time; none when the image is gone.
func (r *Runtime) ImageNames(ctx context.Context, ns, digest string) ([]gc.ImageName, error) {
	imgs, err := r.Client.ImageService().List(in(ctx, ns), "target.digest=="+strconv.Quote(digest))
	if err != nil {
		return nil, fmt.Errorf("list names of image %s: %w", digest, err)
	}
	out := make([]gc.ImageName, 0, len(imgs))
	for _, img := range imgs {
		if img.Target.Digest.String() != digest { // the filter is the daemon's; trust but verify
			continue
		}
		out = append(out, gc.ImageName{Name: img.Name, Labels: img.Labels, Created: img.CreatedAt})
	}
	slices.SortFunc(out, func(a, b gc.ImageName) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RemoveImage deletes every name of one image (names all point at digest,
// as the re-check right before saw them) and reports how: "cri" when CRI
// manages the image and knows exactly these names (CRI RemoveImage by image
// id deletes all its references, the last synchronously, and keeps CRI's
// cache right), "native" otherwise (each name guarded by its target and its
// creation time, the last one synchronously, so containerd's GC has freed
// the blobs and snapshots when it returns). Only names the re-check saw are
// deleted natively: after CRI's removal, a name on the digest that the
// re-check did not see (a pull made it during the call, also under a name
// the re-check saw but deleted meanwhile) is kept, and the error wraps
// gc.ErrImageChanged. Names already gone are skipped; when every name was
// already gone, someone else deleted the image: gc.ErrOwnerWon, not our
// removal. It returns an error wrapping gc.ErrImageChanged when a name was
// re-pointed at another target or made again meanwhile (nothing more was
// deleted); any other error leaves the outcome for the delete transaction
// to settle.
func (r *Runtime) RemoveImage(ctx context.Context, ns, digest string, names []gc.ImageName) (string, error) {
	ctx = in(ctx, ns)
	if len(names) == 0 {
		return viaNative, gc.ErrOwnerWon
	}
	via := viaNative
	ours := false
	var made []string // names on the digest after CRI's removal that the re-check did not see
	if r.CRIImages != nil && criIn(ns) && criManaged(names) {
		ok, err := r.removeImageCRI(ctx, names)
		if err != nil {
			return viaCRI, err
		}
		if ok {
			ours = true
			via = viaCRI
			// Names CRI did not know remain: those the re-check saw (a
			// name created natively) go natively; any other was made
			// during the call and is not ours.
			left, err := r.ImageNames(ctx, ns, digest)
			if err != nil {
				return via, err
			}
			names, made = rechecked(left, names)
		}
	}
	deleted, err := r.removeImageNative(ctx, digest, names)
	switch {
	case !ours && deleted == 0 && err == nil:
		return via, gc.ErrOwnerWon
	case !ours && deleted == 0 && errors.Is(err, gc.ErrImageChanged):
		// Its owner re-pointed the name (a re-pull, a re-tag) before we
		// deleted anything: not ours, and no outcome to settle (the
		// digest may well have no name left now).
		return via, fmt.Errorf("%w: %w", gc.ErrOwnerWon, err)
	case err == nil && len(made) > 0:
		return via, fmt.Errorf("%w: %s made during the removal, kept", gc.ErrImageChanged, strings.Join(made, ", "))
	}
	return via, err
}

// rechecked splits left, the names on a digest now, into those the
// re-check saw (the same name and creation time) and the names of the
// others.
func rechecked(left, seen []gc.ImageName) (same []gc.ImageName, others []string) {
	for _, n := range left {
		if slices.ContainsFunc(seen, func(s gc.ImageName) bool { return sameName(s, n.Name, n.Created) }) {
			same = append(same, n)
		} else {
			others = append(others, n.Name)
		}
	}
	return same, others
}

// sameName reports whether record (name, created) is the one n was read
// from: a name deleted and made again since is another record.
func sameName(n gc.ImageName, name string, created time.Time) bool {
	return n.Name == name && n.Created.Equal(created)
}

func criManaged(names []gc.ImageName) bool {
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
func (r *Runtime) removeImageCRI(ctx context.Context, names []gc.ImageName) (bool, error) {
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
			return false, nil // gone meanwhile: not ours
		}
		return true, fmt.Errorf("cri remove image %q: %w", id, err)
	}
	return true, nil
}

// removeImageNative deletes each name guarded by the target: a 2.x daemon
// honours DeleteTarget; a 1.x daemon ignores it, so each name is read back
// first and compared (a window of one round trip remains there). A name
// whose record is not the one the re-check read (another creation time: a
// pull deleted and made it again) is another image's now: ErrImageChanged.
func (r *Runtime) removeImageNative(ctx context.Context, digest string, names []gc.ImageName) (deleted int, err error) {
	is := r.Client.ImageService()
	for i, n := range names {
		cur, err := is.Get(ctx, n.Name)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("get image %q: %w", n.Name, err)
		}
		if cur.Target.Digest.String() != digest {
			return deleted, fmt.Errorf("image %q: %w (%s)", n.Name, gc.ErrImageChanged, cur.Target.Digest)
		}
		if !sameName(n, cur.Name, cur.CreatedAt) {
			return deleted, fmt.Errorf("image %q: %w (made again at %s)", n.Name, gc.ErrImageChanged, cur.CreatedAt.UTC().Format(time.RFC3339Nano))
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
				return deleted, fmt.Errorf("image %q: %w (%s)", n.Name, gc.ErrImageChanged, cur.Target.Digest)
			}
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("delete image %q: %w", n.Name, err)
		}
		deleted++
	}
	return deleted, nil
}

// SandboxImages asks CRI which sandbox (pause) images it is configured with:
// RuntimeService.Status with verbose set returns CRI's config as JSON, which
// names it "sandboxImage" on containerd 1.x. Where a daemon reports pinned
// images ("pinnedImages", e.g. {"sandbox": ...}) those count too; 2.x keeps
// them out of Status but labels them pinned instead. It returns none, without
// error, when the config does not say.
func (r *Runtime) SandboxImages(ctx context.Context) ([]string, error) {
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
func (f Statfs) Disk() (gc.DiskStats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.Path, &st); err != nil {
		return gc.DiskStats{}, fmt.Errorf("statfs %s: %w", f.Path, err)
	}
	bs := uint64(st.Bsize)
	return gc.DiskStats{CapacityBytes: st.Blocks * bs, AvailableBytes: st.Bavail * bs}, nil
}
