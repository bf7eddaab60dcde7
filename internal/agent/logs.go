package agent

import (
	"context"
	"path/filepath"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/projection"
)

// LogsConfig is the log cleaner's part of c.
func (c Config) LogsConfig() logs.Config {
	return logs.Config{LogDir: c.LogDir, PodLogDir: c.PodLogDir, HostPodLogDir: c.HostPodLogDir, PodLogGrace: c.PodLogGrace, DryRun: c.DryRun}
}

// setupLogs builds the log cleaner and subscribes it to the projection;
// call it before the projection runs (Subscribe's contract). The kubelet's
// logs are of CRI's containers: when CRI's namespace is not managed the
// agent cannot tell a live container's log from a dead one's, and the
// cleaner stays off.
func (a *agent) setupLogs() error {
	m, err := logs.NewMetrics(a.reg)
	if err != nil {
		return err
	}
	if nss, _ := a.cfg.Namespaces(); !nss.Match(events.CRINamespace) {
		a.log.Info().Str("component", "logs").Str("namespaces", nss.String()).
			Msg("log cleanup off: the kubelet's logs belong to namespace " + events.CRINamespace + ", which is not managed")
		return nil
	}
	cl, err := logs.New(logs.Deps{State: logs.LiveState(a.live.In(events.CRINamespace), a.source.Containerd), Changes: a.live.Subscribe(),
		Deletes: a.deletes, Publisher: a.pub, PodDirs: a.podDirs},
		logs.Options{Config: a.cfg.LogsConfig(), Metrics: m, Log: a.log, Clock: clock.System(a.clock.Now), MinGap: logsMinGap})
	if err != nil {
		return err
	}
	a.logs = cl
	return nil
}

// loadPodDirs restores the pod dirs the agent saw (logs.PodDirs) from
// its state dir. A file it cannot read is no evidence: it starts with
// none seen, says so, and no pod counts as deleted by its log dir until
// one is seen and goes.
func (a *agent) loadPodDirs() {
	file := filepath.Join(a.cfg.StateDir, logs.PodDirsFile)
	d, err := logs.LoadPodDirs(file)
	if err != nil {
		a.log.Warn().Str("component", "logs").Str("file", file).Err(err).
			Msg("pod dirs seen not restored: pods deleted while the agent was away are not told by their log dirs")
	}
	a.podDirs = d
}

// logsMinGap spaces the log passes projection changes ask for: a burst of
// events costs one pass (two directory scans) per gap, not one per event.
// A link that dangles is seen by fsnotify at once anyway.
const logsMinGap = 50 * time.Millisecond

// runLogs runs the cleaner, if there is one, until ctx ends.
func (a *agent) runLogs(ctx context.Context) error {
	if a.logs == nil {
		<-ctx.Done()
		return nil
	}
	return a.logs.Run(ctx)
}

// PlanLogs plans the log dirs against s, listed from the containerd named
// containerd (node.Source.Containerd), deleting nothing (for `gcagent
// plan`). Entries count as first seen now, so unknown ones wait their grace.
func PlanLogs(cfg Config, s *projection.State, dirs gc.PodLogDir, containerd string) (logs.Plan, error) {
	d, _ := dirs.(*logs.PodDirs)
	cl, err := logs.New(logs.Deps{State: logs.StaticState(s, containerd), PodDirs: d}, logs.Options{Config: cfg.LogsConfig()})
	if err != nil {
		return logs.Plan{}, err
	}
	return cl.Plan()
}
