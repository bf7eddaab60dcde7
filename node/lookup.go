package node

import (
	"context"
	"fmt"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/gcagent/gcagent/events"
	"google.golang.org/grpc"
)

func (s *Source) lookupImage(ctx context.Context, at time.Time, name string) (events.Event, error) {
	img, err := s.o.Client.ImageService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, nil // deleted since; its delete event follows
	}
	if err != nil {
		return nil, fmt.Errorf("get image %q: %w", name, err)
	}
	return imageEvent(at, img, s.facts(ctx, img)), nil
}

func (s *Source) lookupContainer(ctx context.Context, at time.Time, id string) (events.Event, error) {
	ns, _ := namespaces.Namespace(ctx)
	var (
		c  containers.Container // without its spec and extensions
		ev events.ContainerUpserted
		// The refs CRI stored (criImageRefs).
		imageID string
		vols    []string
	)
	err := s.getContainer(ctx, id, func(got containers.Container) {
		ev = containerEventIn(ns, at, got, nil)
		imageID, vols = criImageRefs(got)
		got.Spec, got.Extensions = nil, nil
		c = got
	})
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get container %q: %w", id, err)
	}
	ev.Created = s.created(c, at)
	if c.Image != "" {
		if img, err := s.o.Client.ImageService().Get(ctx, c.Image); err == nil {
			ev.ImageDigest = img.Target.Digest.String()
		}
	}
	var rootErr error
	rootOf := func(snapshotter, key string) string {
		var chain string
		chain, rootErr = s.lookupAncestry().rootChain(ctx, snapshotter, key)
		return chain
	}
	// A sandbox's image volumes appear after the sandbox; the listings and
	// the app containers' own volume mounts cover them.
	noVolumes := func(string) []string { return nil }
	criFacts(&ev, imageID, vols, s.configOf(ctx, nil))
	ev.RestartManaged = restartManaged(c.Labels)
	contentFacts(&ev, snapshotterOf(c), c.SnapshotKey, rootOf, noVolumes)
	if rootErr != nil {
		return nil, fmt.Errorf("rootfs of container %q: %w", c.ID, rootErr)
	}
	return ev, nil
}

// getContainer gets container id's record, decoded as a listing decodes
// one (a GetContainerResponse is shaped as a ListContainerMessage, see
// listCodec), and calls each with it while its spec and extensions are the
// response's buffer: a CRI container's 13 KiB of them are read in place,
// never copied, for every container created.
func (s *Source) getContainer(ctx context.Context, id string, each func(containers.Container)) error {
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		c, err := s.o.Client.ContainerService().Get(ctx, id)
		if err == nil {
			each(c)
		}
		return err
	}
	found := false
	m := streamedContainer{bodies: func(*containers.Container) bool { return true }, each: func(c containers.Container) {
		found = c.ID != ""
		if found {
			each(c)
		}
	}}
	err := conn.Invoke(ctx, "/containerd.services.containers.v1.Containers/Get", &containersapi.GetContainerRequest{ID: id}, &m, grpc.ForceCodecV2(newListCodec()))
	switch {
	case err != nil:
		return errgrpc.ToNative(err)
	case !found:
		return fmt.Errorf("containerd answered no record for container %q", id)
	}
	return nil
}

// configOf returns a resolver of image refs (names, normalized or not, or
// CRI image ids) to config digests; listed resolves a name to its config
// digest when a listing has the images (nil: the image service is asked,
// and the facts read unless the projection holds them).
func (s *Source) configOf(ctx context.Context, listed func(name string) (config string, ok bool)) func(string) string {
	return func(ref string) string {
		for _, name := range normalizedRefs(ref) {
			if listed != nil {
				if cfg, ok := listed(name); ok && cfg != "" {
					return cfg
				}
				continue
			}
			if img, err := s.o.Client.ImageService().Get(ctx, name); err == nil {
				if f := s.facts(ctx, img); f.Config != "" {
					return f.Config
				}
			}
		}
		if configDigestRe.MatchString(ref) {
			return ref // a CRI image id with no name of that spelling
		}
		return ""
	}
}
