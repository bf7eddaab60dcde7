package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/usage"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/gcagent/gcagent/events"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
)

// What a container runs is found by content, never by the name it was
// created from: a name can move to another image (a re-pull of app:1)
// while the container still runs the old one. Three facts say it:
//   - CRI stores the image id (config digest) of each container, and of each
//     image mounted as an OCI image volume, in its container metadata;
//   - every rootfs snapshot descends from the chain id of its image's top
//     layer, for any client: its parent, or its nearest ancestor that is an
//     image's top when a client put a copy in between (rootChain);
//   - containerd 2.1+ prepares image volumes as snapshots keyed
//     .../image-volumes/<sandbox id>/..., held by a lease named after the
//     sandbox, with no container record naming the image.

// CRI's container metadata extension and its image-volume snapshot keys
// (copied: containerd's are internal).
const (
	extCRIContainerMetadata = "io.cri-containerd.container.metadata"
	imageVolumesDir         = "/image-volumes/"
	defaultSnapshotter      = "overlayfs"
)

// Restart-policy labels: containerd's restart monitor (and nerdctl
// --restart, which uses it) restarts a container whose status label says
// running, so its exit is not its end.
const (
	labelRestartStatus = "containerd.io/restart.status"
	labelRestartPolicy = "containerd.io/restart.policy"
)

var configDigestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ImageFacts are what never change for a target digest: its size as the
// kubelet counts it, its config digest (the CRI image id) and the chain id
// of its top layer.
type ImageFacts struct {
	Size   int64
	Config string
	Chain  string
}

// ContainerFacts are what a CRI container's spec and CRI metadata say of
// it, which never change while it exists: its pod sandbox, the image id it
// was created from and those of its image volumes.
type ContainerFacts struct {
	SandboxID      string
	ImageID        string
	VolumeImageIDs []string
}

// facts returns img's facts: those the projection holds (KnownFacts),
// else read from the content store. A fact that cannot be read is left
// empty (the next lookup tries again). The projection is the one cache:
// what it forgets (an image deleted) is forgotten here too.
func (s *Source) facts(ctx context.Context, img images.Image) ImageFacts {
	f, ok := s.knownFacts(img.Target.Digest.String())
	if ok {
		return f
	}
	return s.readFacts(ctx, img, f, nil)
}

// readFacts completes f, what the projection holds of img's facts, from
// the content store's labels (ix, a listing's; nil: none) or by reading
// its blobs.
func (s *Source) readFacts(ctx context.Context, img images.Image, f ImageFacts, ix *contentIndex) ImageFacts {
	lf, ok := ix.facts(img)
	if ok {
		return lf
	}
	if lf.Size > 0 && f.Size <= 0 {
		f.Size = lf.Size
	}
	// The size walk, the config lookup and the rootfs read all start from
	// the same index and manifest: each blob is read once.
	blobs := &blobCache{cs: s.o.Client.ContentStore(), blobs: map[digest.Digest][]byte{}}
	if conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface); ok {
		blobs.api = contentapi.NewContentClient(conn)
	}
	platform := platforms.Default() // the client's, as client.Image uses
	if f.Size <= 0 {
		n, err := usage.CalculateImageUsage(ctx, img, blobs, usage.WithManifestLimit(platform, 1), usage.WithManifestUsage())
		if err != nil {
			s.o.Log.Debug().Err(err).Str("image", img.Name).Msg("image size unknown")
		}
		f.Size = n
	}
	if f.Chain == "" && lf.Config != "" && (f.Config == "" || f.Config == lf.Config) {
		// The config the labels name: its diff ids, one read.
		cfg := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.Digest(lf.Config), Size: ix.blobs[lf.Config].size}
		if diffIDs, err := images.RootFS(ctx, blobs, cfg); err == nil && len(diffIDs) > 0 {
			f.Config, f.Chain = lf.Config, identity.ChainID(diffIDs).String()
		}
	}
	if f.Config == "" || f.Chain == "" {
		if cfg, err := img.Config(ctx, blobs, platform); err == nil {
			f.Config = cfg.Digest.String()
			if chain := ix.chain(f.Config); chain != "" {
				f.Chain = chain
			} else if diffIDs, err := images.RootFS(ctx, blobs, cfg); err == nil && len(diffIDs) > 0 {
				f.Chain = identity.ChainID(diffIDs).String()
			}
		}
	}
	return f
}

// knownFacts returns what the projection holds of target digest d's
// facts; ok when they are complete.
func (s *Source) knownFacts(d string) (f ImageFacts, ok bool) {
	f = s.o.KnownFacts(d)
	return f, f.complete()
}

func (f ImageFacts) complete() bool { return f.Size > 0 && f.Config != "" && f.Chain != "" }

// Labels containerd puts on content (its garbage collector follows them):
// when it pulls an image, on a manifest the digests of its config and of
// its layers (l.0, l.1, ...); when it unpacks it for a snapshotter, on the
// config the chain id of the top layer's snapshot.
const (
	labelContentRef  = "containerd.io/gc.ref.content."
	labelConfigRef   = labelContentRef + "config"
	labelLayerRef    = labelContentRef + "l."
	labelSnapshotRef = "containerd.io/gc.ref.snapshot."
)

// contentIndex is one listing of the content store: each blob's size and
// labels, by digest, and the snapshotters in use. It lets a first listing
// take most images' facts without reading a blob.
type contentIndex struct {
	blobs        map[string]blobInfo
	snapshotters []string
}

type blobInfo struct {
	size   int64
	labels gcLabels
}

// gcLabels are a blob's labels that containerd's garbage collector follows
// (gcRefLabel): a few at most, so a slice, not a map, for each of a busy
// node's tens of thousands of blobs.
type gcLabels []gcLabel

type gcLabel struct{ key, value string }

// get returns the value of key, "" if absent.
func (l gcLabels) get(key string) string {
	v, _ := l.lookup(key)
	return v
}

func (l gcLabels) lookup(key string) (string, bool) {
	for _, e := range l {
		if e.key == key {
			return e.value, true
		}
	}
	return "", false
}

// set sets key to value, as a map would.
func (l gcLabels) set(key, value string) gcLabels {
	for i, e := range l {
		if e.key == key {
			l[i].value = value
			return l
		}
	}
	return append(l, gcLabel{key, value})
}

// listContent lists the content store once, keeping of each blob its size
// and its gc.ref labels (listedContent); an error yields nil (facts then
// read the blobs).
func (s *Source) listContent(ctx context.Context, snapshotters []string) *contentIndex {
	ix := &contentIndex{blobs: map[string]blobInfo{}, snapshotters: snapshotters}
	if err := s.walkContent(ctx, func(dgst string, size int64, labels gcLabels) {
		ix.blobs[dgst] = blobInfo{size, labels}
	}); err != nil {
		s.o.Log.Debug().Err(err).Msg("content not listed: image facts are read")
		return nil
	}
	return ix
}

// walkContent calls each with every blob of the content store (listedContent).
func (s *Source) walkContent(ctx context.Context, each func(dgst string, size int64, labels gcLabels)) error {
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		return s.o.Client.ContentStore().Walk(ctx, func(info content.Info) error {
			var refs gcLabels
			for k, v := range info.Labels {
				if strings.HasPrefix(k, gcRefLabel) {
					refs = refs.set(k, v)
				}
			}
			each(info.Digest.String(), info.Size, refs)
			return nil
		})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := contentapi.NewContentClient(conn).List(ctx, &contentapi.ListContentRequest{}, grpc.ForceCodecV2(newListCodec()))
	if err != nil {
		return errgrpc.ToNative(err)
	}
	m := listedContent{each: each, intern: map[string]string{}}
	for {
		if err := stream.RecvMsg(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return errgrpc.ToNative(err)
		}
	}
}

// chain returns the chain id the unpacker labelled config blob cfg with,
// for one of the snapshotters in use; "" if none.
func (ix *contentIndex) chain(cfg string) string {
	if ix == nil {
		return ""
	}
	for _, sn := range ix.snapshotters {
		if c := ix.blobs[cfg].labels.get(labelSnapshotRef + sn); configDigestRe.MatchString(c) {
			return c
		}
	}
	return ""
}

// facts returns img's facts from labels alone when img is one manifest
// whose labels name its config and layers and nothing else, all of them in
// the store, and whose config is unpacked: the size is then exactly what
// the kubelet's size walk adds up (the manifest's, the config's and each
// layer's). Anything else (an index, layers discarded after unpacking, a
// child of another kind, a blob missing) is read instead; when only the
// chain is missing (not unpacked), the facts returned hold the size and
// the config, and only the config is read.
func (ix *contentIndex) facts(img images.Image) (ImageFacts, bool) {
	if ix == nil || !images.IsManifestType(img.Target.MediaType) || img.Target.Size <= 0 {
		return ImageFacts{}, false
	}
	m, ok := ix.blobs[img.Target.Digest.String()]
	if !ok {
		return ImageFacts{}, false
	}
	f := ImageFacts{Size: img.Target.Size, Config: m.labels.get(labelConfigRef)}
	layers := 0
	for _, l := range m.labels {
		switch k := l.key; {
		case !strings.HasPrefix(k, labelContentRef), k == labelConfigRef:
		case strings.HasPrefix(k, labelLayerRef):
			layers++
		default:
			return ImageFacts{}, false // a child the size walk would count too
		}
	}
	if layers == 0 {
		return ImageFacts{}, false // layers discarded after unpacking: unlabelled
	}
	children := []string{f.Config}
	for i := range layers {
		l, ok := m.labels.lookup(fmt.Sprintf("%s%d", labelLayerRef, i))
		if !ok {
			return ImageFacts{}, false // not l.0 ... l.n-1
		}
		children = append(children, l)
	}
	for _, d := range children {
		b, ok := ix.blobs[d]
		if !ok {
			return ImageFacts{}, false
		}
		f.Size += b.size
	}
	if !configDigestRe.MatchString(f.Config) {
		return ImageFacts{}, false
	}
	// Not unpacked (pulled by `ctr content fetch`, buildkit, a pre-pull
	// cache): the size and config are known, the chain is read.
	f.Chain = ix.chain(f.Config)
	return f, f.Chain != ""
}

// blobCache serves the blobs of one image's facts, each read from
// containerd once, in one call (the content store's ReaderAt makes two:
// info, then the stream).
type blobCache struct {
	cs    content.InfoReaderProvider
	api   contentapi.ContentClient // nil: read through cs
	blobs map[digest.Digest][]byte
}

// maxMetadataBlob bounds a blob read whole: indexes, manifests and configs
// are kilobytes; a store that streams more for one is not trusted.
const maxMetadataBlob = 16 << 20

// read returns the whole blob desc names.
func (b *blobCache) read(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	if b.api == nil {
		return content.ReadBlob(ctx, b.cs, desc)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := b.api.Read(ctx, &contentapi.ReadContentRequest{Digest: desc.Digest.String()})
	if err != nil {
		return nil, errgrpc.ToNative(err)
	}
	var p []byte
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return p, nil
		}
		if err != nil {
			return nil, errgrpc.ToNative(err)
		}
		if len(p)+len(resp.Data) > maxMetadataBlob {
			return nil, fmt.Errorf("blob %s: more than %d bytes", desc.Digest, maxMetadataBlob)
		}
		p = append(p, resp.Data...)
	}
}

func (b *blobCache) Info(ctx context.Context, d digest.Digest) (content.Info, error) {
	return b.cs.Info(ctx, d)
}

func (b *blobCache) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	p, ok := b.blobs[desc.Digest]
	if !ok {
		var err error
		if p, err = b.read(ctx, desc); err != nil {
			return nil, err
		}
		b.blobs[desc.Digest] = p
	}
	return bytesReaderAt{bytes.NewReader(p)}, nil
}

type bytesReaderAt struct{ *bytes.Reader }

func (bytesReaderAt) Close() error { return nil }

// criMetadata is the part of CRI's container metadata gcagent reads: the
// image id and the image-volume mounts. The extension is JSON whatever the
// containerd version.
type criMetadata struct {
	Metadata struct {
		ImageRef string `json:"ImageRef"`
		Config   struct {
			Mounts []struct {
				Image *struct {
					Image string `json:"image"`
				} `json:"image"`
			} `json:"mounts"`
		} `json:"Config"`
	} `json:"Metadata"`
}

// skim decodes into m only the fields it has, found by jsonField: the
// metadata holds the whole CRI container config (environment, mounts,
// labels, annotations). It reports false when doc must be decoded whole.
func (m *criMetadata) skim(doc []byte) bool {
	meta, ok := jsonField(doc, "Metadata")
	if !ok || meta == nil {
		return ok
	}
	ref, ok := jsonField(meta, "ImageRef")
	if !ok {
		return false
	}
	cfg, ok := jsonField(meta, "Config")
	if !ok {
		return false
	}
	var mounts []byte
	if cfg != nil {
		if mounts, ok = jsonField(cfg, "mounts"); !ok {
			return false
		}
	}
	for _, f := range []struct {
		raw []byte
		v   any
	}{{ref, &m.Metadata.ImageRef}, {mounts, &m.Metadata.Config.Mounts}} {
		if f.raw != nil && json.Unmarshal(f.raw, f.v) != nil {
			return false
		}
	}
	return true
}

// criImageRefs returns the image id CRI stored for c and the image refs of
// its image-volume mounts; empty for a container CRI did not create.
func criImageRefs(c containers.Container) (imageID string, volumes []string) {
	ext, ok := c.Extensions[extCRIContainerMetadata]
	if !ok || ext == nil {
		return "", nil
	}
	var m criMetadata
	if !m.skim(ext.GetValue()) {
		m = criMetadata{} // what skim set before it gave up
		if err := json.Unmarshal(ext.GetValue(), &m); err != nil {
			return "", nil
		}
	}
	for _, mnt := range m.Metadata.Config.Mounts {
		if mnt.Image != nil && mnt.Image.Image != "" {
			volumes = append(volumes, mnt.Image.Image)
		}
	}
	return m.Metadata.ImageRef, volumes
}

// restartManaged reports whether a restart policy wants c running: the
// monitor's status label says running, or a policy is set without a status.
func restartManaged(labels map[string]string) bool {
	if st, ok := labels[labelRestartStatus]; ok {
		return st == "running"
	}
	_, ok := labels[labelRestartPolicy]
	return ok
}

// sandboxOfVolume returns the sandbox id of an image-volume snapshot key
// (<cri state dir>/image-volumes/<sandbox id>/<digest hex>), or "".
func sandboxOfVolume(key string) string {
	i := strings.LastIndex(key, imageVolumesDir)
	if i < 0 {
		return ""
	}
	rest := key[i+len(imageVolumesDir):]
	if j := strings.IndexByte(rest, '/'); j > 0 {
		return rest[:j]
	}
	return ""
}

// snapshotIndex is what a listing learns from the snapshotters: the parent
// of every snapshot (committed ones too, for rootChain's walk), and the
// parents of each sandbox's image-volume snapshots.
type snapshotIndex struct {
	parents map[snapshotRef]string // -> parent
	volumes map[string][]string    // sandbox id -> parents of its image volumes
}

// snapshotRef names a snapshot: its snapshotter and its key or name.
type snapshotRef struct{ snapshotter, name string }

// walkSnapshots indexes the snapshots of the given snapshotters.
func (s *Source) walkSnapshots(ctx context.Context, snapshotters []string) (snapshotIndex, error) {
	ix := snapshotIndex{parents: map[snapshotRef]string{}, volumes: map[string][]string{}}
	for _, sn := range snapshotters {
		err := s.o.Client.SnapshotService(sn).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Parent == "" {
				return nil
			}
			ix.parents[snapshotRef{sn, info.Name}] = info.Parent
			if info.Kind == snapshots.KindCommitted {
				return nil // an image layer, or a remapped copy of one
			}
			if sb := sandboxOfVolume(info.Name); sb != "" {
				ix.volumes[sb] = append(ix.volumes[sb], info.Parent)
			}
			return nil
		})
		if err != nil {
			return ix, fmt.Errorf("walk snapshots of %s: %w", sn, err)
		}
	}
	for sb, ps := range ix.volumes {
		slices.Sort(ps)
		ix.volumes[sb] = slices.Compact(ps)
	}
	return ix, nil
}

// snapshotterOf is c's snapshotter, the default when unset.
func snapshotterOf(c containers.Container) string {
	if c.Snapshotter == "" {
		return defaultSnapshotter
	}
	return c.Snapshotter
}

// criFacts fills ev's CRI image id and volume image ids from the refs CRI
// stored for the container (criImageRefs); configOf resolves a volume
// image ref (a name or an image id) to a config digest.
func criFacts(ev *events.ContainerUpserted, imageID string, volumes []string, configOf func(ref string) string) {
	if configDigestRe.MatchString(imageID) {
		ev.ImageID = imageID
	}
	for _, ref := range volumes {
		if cfg := configOf(ref); cfg != "" {
			ev.VolumeImageIDs = append(ev.VolumeImageIDs, cfg)
		}
	}
	slices.Sort(ev.VolumeImageIDs)
	ev.VolumeImageIDs = slices.Compact(ev.VolumeImageIDs)
}

// fill sets ev's CRI facts to what the projection knows.
func (f *ContainerFacts) fill(ev *events.ContainerUpserted) {
	ev.ImageID, ev.VolumeImageIDs = f.ImageID, slices.Clone(f.VolumeImageIDs)
}

// contentFacts fills the rest of what container ev runs into it: the chain
// its rootfs snapshot (of snapshotter, key) was prepared from (rootOf, see
// rootChain) and the image volumes its sandbox holds (volumesOf).
func contentFacts(ev *events.ContainerUpserted, snapshotter, key string, rootOf func(snapshotter, key string) string,
	volumesOf func(sandboxID string) []string) {
	if key != "" {
		ev.RootChain = rootOf(snapshotter, key)
	}
	if ev.CRIKind == "sandbox" {
		ev.VolumeChains = volumesOf(ev.ID)
	}
}

// normalizedRefs returns ref and, when it parses, its normalized form
// (nginx:1 -> docker.io/library/nginx:1), the names containerd stores.
func normalizedRefs(ref string) []string {
	out := []string{ref}
	if n, err := reference.ParseNormalizedNamed(ref); err == nil {
		if full := reference.TagNameOnly(n).String(); full != ref {
			out = append(out, full)
		}
	}
	return out
}
