package agent

import (
	"context"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
)

// setupImageGC builds the image GC and subscribes it to the projection;
// call it before the projection runs (Subscribe's contract).
func (a *agent) setupImageGC() error {
	g, err := gc.NewImageGC(gc.ImageGCDeps{
		Projection: a.live, Runtime: a.runtime, Disk: a.imageFS, Deletes: a.deletes, Publisher: a.pub,
		LearnSandboxImages: a.runtime.SandboxImages,
	}, gc.ImageGCOptions{
		Policy:       a.cfg.ImagePolicy(),
		DryRun:       a.cfg.DryRun,
		DiskInterval: a.cfg.DiskInterval,
		Clock:        clock.System(a.clock.Now),
		Log:          a.log.With().Str("component", "imagegc").Logger(),
		Registerer:   a.reg,
	})
	if err != nil {
		return err
	}
	a.imageGC = g
	a.lastGC = func() *schema.LastGC {
		if st := a.imageGC.Status(); st.LastPass != nil {
			p := lastImagePass(*st.LastPass)
			return &p
		}
		return nil
	}
	a.runGCNow = func(ctx context.Context) (any, error) { return a.imageGC.RunNow(ctx) }
	return nil
}

// runImageGC runs the image GC until ctx ends.
func (a *agent) runImageGC(ctx context.Context) error { return a.imageGC.Run(ctx) }

// imagePassSummary is schema.LastGC: the last image GC pass in heartbeats.
type imagePassSummary = schema.LastGC

func lastImagePass(p gc.ImagePass) imagePassSummary {
	return imagePassSummary{Kind: "image", At: p.End, Trigger: p.Trigger, DryRun: p.DryRun, Removed: len(p.Removed),
		Skipped: len(p.Skipped), Bytes: p.EstimatedBytes, FreedBytes: p.FreedBytes, Usage: p.UsageAfter, Error: p.Error}
}
