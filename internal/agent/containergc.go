package agent

import (
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
)

// containerPolicy is the container GC policy the flags describe.
func (c Config) ContainerPolicy() gc.ContainerPolicy {
	return gc.ContainerPolicy{
		MinAge:          c.MinimumContainerTTL,
		MaxPerEvictUnit: c.MaxDeadPerContainer,
		MaxContainers:   c.MaxDeadContainers,
		Prune:           gc.PruneMode(c.PruneContainers),

		UncollectedGrace: c.UncollectedExitGrace,
	}
}

// containerGCMinGap spaces the container GC's passes in a burst of events:
// at most 20 full plans a second, whatever the event rate, for at most
// 50 ms more latency.
const containerGCMinGap = 50 * time.Millisecond

// setupContainerGC builds the container GC and subscribes it to the
// projection; call it before the projection runs (Subscribe's contract).
func (a *agent) setupContainerGC() error {
	m, err := gc.NewContainerMetrics(a.reg)
	if err != nil {
		return err
	}
	cgc, err := gc.NewContainerGC(a.live, a.live.Subscribe(), a.runtime, gc.ContainerGCOptions{
		Policy:    a.cfg.ContainerPolicy(),
		DryRun:    a.cfg.DryRun,
		Publisher: a.pub,
		Deletes:   a.deletes,
		Metrics:   m,
		Logger:    a.log,
		PodKept:   logs.PodLogDirExists(a.cfg.PodLogDir),
		Clock:     clock.System(a.clock.Now),
		MinGap:    containerGCMinGap,
	})
	if err != nil {
		return err
	}
	a.containerGC = cgc
	return nil
}
