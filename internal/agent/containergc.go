package agent

import (
	"path/filepath"
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
		PodGrace:         c.PodLogGrace,
		KubeletStatusLag: c.KubeletStatusLag,
	}
}

// podLogDir is the pod log dir as plans read it: the running agent's
// pod dirs seen (d), or, for a plan without a running agent, those it
// saved in stateDir with a read of dir now on top (a pod whose dir was
// seen and is missing now counts as gone since now). A read that fails
// leaves the dir unknown: no pod counts as deleted.
func podLogDir(d *logs.PodDirs, cfg Config, now time.Time) gc.PodLogDir {
	if d != nil {
		return d.Clone()
	}
	d, _ = logs.LoadPodDirs(filepath.Join(cfg.StateDir, logs.PodDirsFile))
	d.Read(cfg.PodLogDir, now)
	return d
}

// containerGCMinGap spaces the container GC's passes in a burst of events:
// at most 20 full plans a second, whatever the event rate, for at most
// 50 ms more latency.
const containerGCMinGap = 50 * time.Millisecond

// setupContainerGC builds the container GC and subscribes it to the
// projection; call it before the projection runs (Subscribe's contract).
func (a *agent) setupContainerGC() error {
	m, err := gc.NewContainerMetrics(a.reg, a.cfg.metricNamespaces()...)
	if err != nil {
		return err
	}
	files, err := logs.NewContainerLogs(a.cfg.LogsConfig())
	if err != nil {
		return err
	}
	cgc, err := gc.NewContainerGC(gc.ContainerGCDeps{
		State: a.live, Changes: a.live.Subscribe(), Runtime: a.runtime, Deletes: a.deletes, Publisher: a.pub,
		PodLogDir: a.podDirs, Logs: files,
	}, gc.ContainerGCOptions{
		Policy:  a.cfg.ContainerPolicy(),
		DryRun:  a.cfg.DryRun,
		Metrics: m,
		Log:     a.log,
		Clock:   clock.System(a.clock.Now),
		MinGap:  containerGCMinGap,
	})
	if err != nil {
		return err
	}
	a.containerGC = cgc
	return nil
}
