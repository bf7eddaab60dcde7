package agent

import (
	"context"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
)

// setupImageGC builds the image GC and subscribes it to the projection;
// call it before the projection runs (Subscribe's contract).
func (a *agent) setupImageGC() error {
	deps := gc.ImageGCDeps{
		Projection: a.live, Runtime: a.runtime, Disk: a.imageFS, Deletes: a.deletes, Publisher: a.pub,
		LearnSandboxImages: a.runtime.SandboxImages, Record: a.record, FleetKeep: a.keep.KeepList,
		Ready: a.imageGCReady,
	}
	if a.trace != nil {
		deps.Trace = newTraceRecorder(a.trace, a.cfg.DryRun, a.log.With().Str("component", "trace").Logger())
	}
	g, err := gc.NewImageGC(deps, gc.ImageGCOptions{
		Policy:       a.cfg.ImagePolicy(),
		RegretWindow: a.cfg.RegretWindow,
		DryRun:       a.cfg.DryRun,
		DiskInterval: a.cfg.DiskInterval,
		Clock:        clock.System(a.clock.Now),
		Log:          a.log.With().Str("component", "imagegc").Logger(),
		Registerer:   a.reg,
		Namespaces:   a.cfg.metricNamespaces(),
	})
	if err != nil {
		return err
	}
	a.imageGC = g
	// A new fleet keep list is planned with at once: an image it no longer
	// keeps goes in the next pass, not at the next retry. Its first read,
	// or the end of the wait for it, does so when a plan held an image
	// for it.
	a.keep.changed = func() { g.Nudge("keep-list") }
	a.keep.settled = func() { g.Reconsider("keep-list") }
	for _, p := range a.cfg.KeepImages {
		a.log.Info().Str("component", "imagegc").Str("pattern", p).Str("covers", gc.DescribeKeepPattern(p)).Msg("--keep-image pattern")
	}
	a.regrets, err = gc.NewRegretReporter(a.live, a.pub, a.record, a.clock.Now,
		a.log.With().Str("component", "imagegc").Logger(), a.reg, a.cfg.metricNamespaces()...)
	if err != nil {
		return err
	}
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

// record journals ev in namespace ns's projection, after the events the
// node sent before it; it fails only when ctx ends first.
func (a *agent) record(ctx context.Context, ns string, ev events.Event) error {
	select {
	case a.evs <- events.Scoped{Namespace: ns, Event: ev}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runImageGC runs the image GC until ctx ends. Its passes wait for
// imageGCReady.
func (a *agent) runImageGC(ctx context.Context) error { return a.imageGC.Run(ctx) }

// nudgeImageGCOnLock asks image GC for a pass at each renewal of
// containerd's agent lock after renewals failed, until ctx ends: a pass
// that found the lock not held meanwhile deleted nothing, and no other
// trigger may come soon.
func (a *agent) nudgeImageGCOnLock(ctx context.Context) {
	for {
		select {
		case <-a.lock.HeldAgain():
			a.imageGC.Nudge("agent-lock")
		case <-ctx.Done():
			return
		}
	}
}

// imagePassSummary is schema.LastGC: the last image GC pass in heartbeats.
type imagePassSummary = schema.LastGC

func lastImagePass(p gc.ImagePass) imagePassSummary {
	return imagePassSummary{Kind: "image", At: p.End, Trigger: p.Trigger, DryRun: p.DryRun, Removed: len(p.Removed),
		Skipped: len(p.Skipped), Bytes: p.EstimatedBytes, FreedBytes: p.FreedBytes, Usage: p.UsageAfter, Error: p.Error}
}
