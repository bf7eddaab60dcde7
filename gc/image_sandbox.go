package gc

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// learn asks the runtime for its sandbox images when due.
func (g *ImageGC) learn(ctx context.Context, now time.Time) {
	if g.d.LearnSandboxImages == nil || (g.learnOK && now.Sub(g.learnedAt) < g.o.RelearnInterval) {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	imgs, err := g.d.LearnSandboxImages(lctx)
	cancel()
	g.learnedAt = now
	if err != nil {
		g.learnOK = false
		g.o.Log.Warn().Err(err).Msg("sandbox image not learned from CRI; will retry")
		return
	}
	if !g.learnOK || !slices.Equal(imgs, g.learned) {
		g.o.Log.Info().Strs("sandbox_images", imgs).Msg("sandbox images learned from CRI")
	}
	g.learnOK, g.learned = true, imgs
	g.refreshSandboxes()
}

// observeSandboxes remembers the image (name and digest) of every sandbox
// container in the state: whatever CRI's config says, an image pods were
// started from is a sandbox image, and stays protected after the pods go.
func (g *ImageGC) observeSandboxes(states []*projection.State) {
	added := false
	for _, ref := range SandboxImagesOf(states...) {
		if _, ok := g.sandboxSeen[ref]; !ok {
			g.sandboxSeen[ref], added = struct{}{}, true
		}
	}
	if added {
		g.refreshSandboxes()
	}
}

// SandboxImagesOf returns the image names and digests the sandbox
// containers in states were created from, sorted: images to keep as
// sandbox images whatever the runtime's configuration says.
func SandboxImagesOf(states ...*projection.State) []string {
	var out []string
	for _, s := range states {
		for _, c := range s.Containers {
			if c.CRIKind != projection.KindSandbox {
				continue
			}
			for _, ref := range []string{c.Image, c.ImageDigest} {
				if ref != "" {
					out = append(out, ref)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SandboxImageSet joins the sandbox image lists (configured, learned from
// CRI, seen on sandbox containers) into one sorted set, never nil: the one
// rule for what counts as a sandbox image, for GC and for tools.
func SandboxImageSet(lists ...[]string) []string {
	all := []string{}
	for _, l := range lists {
		all = append(all, l...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

func (g *ImageGC) refreshSandboxes() {
	g.sandboxCache = SandboxImageSet(g.o.Policy.SandboxImages, g.learned, slices.Collect(maps.Keys(g.sandboxSeen)))
	g.mu.Lock()
	g.status.SandboxImages = slices.Clone(g.sandboxCache)
	g.mu.Unlock()
}
