package node

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/gcagent/gcagent/events"
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
	c, err := s.o.Client.ContainerService().Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get container %q: %w", id, err)
	}
	ns, _ := namespaces.Namespace(ctx)
	ev := containerEventIn(ns, at, c, nil)
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
	id, vols := criImageRefs(c)
	criFacts(&ev, id, vols, s.configOf(ctx, nil))
	ev.RestartManaged = restartManaged(c.Labels)
	contentFacts(&ev, snapshotterOf(c), c.SnapshotKey, rootOf, noVolumes)
	if rootErr != nil {
		return nil, fmt.Errorf("rootfs of container %q: %w", c.ID, rootErr)
	}
	return ev, nil
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
