package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/projection"
	"golang.org/x/sync/errgroup"
)

// logsState answers the log cleaner's questions from the projection: the
// agent's Live one, or a state built once (for `gcagent plan`). It asks
// nothing of containerd or CRI: every answer is the projection's, kept up
// to date by containerd's events and relists, so a pass costs no call
// however many pod dirs it judges (PodState says why that is safe).
type logsState struct {
	view func(fn func(*projection.State))
}

var _ logs.State = logsState{}

// liveLogsState reads the agent's projection of CRI's namespace (the only
// one with kubelet logs) under its lock.
func liveLogsState(sp *projection.Spaces) logsState {
	return logsState{view: sp.In(events.CRINamespace).View}
}

// staticLogsState reads s, which nothing else may modify meanwhile.
func staticLogsState(s *projection.State) logsState {
	return logsState{view: func(fn func(*projection.State)) { fn(s) }}
}

// Synced reports whether the projection has listed containerd.
func (s logsState) Synced() (synced bool) {
	s.view(func(st *projection.State) { synced = st.Synced })
	return synced
}

// ContainerState reports a container as running while it is not known to
// have exited (created or running), as the kubelet keeps the link of any
// container that is not exited. An id the projection does not hold exactly
// may be a truncated link name's prefix: it matches the containers it
// prefixes, running if any of them is.
func (s logsState) ContainerState(id string) (running, known bool) {
	s.view(func(st *projection.State) {
		if c := st.Containers[id]; c != nil {
			running, known = c.State != projection.StateExited, true
			return
		}
		if len(id) < 6 || len(id) >= 64 {
			return
		}
		for cid, c := range st.Containers {
			if strings.HasPrefix(cid, id) {
				known = true
				running = running || c.State != projection.StateExited
			}
		}
	})
	return running, known
}

// CRIContainersRunning reports whether a CRI container (not a sandbox) runs.
func (s logsState) CRIContainersRunning() (running bool) {
	s.view(func(st *projection.State) {
		for _, c := range st.Containers {
			if c.CRIKind == projection.KindContainer && c.State == projection.StateRunning {
				running = true
				return
			}
		}
	})
	return running
}

// PodState reports whether a sandbox of uid exists and since when the last
// one is gone, from the projection's pods (remembered for --pod-log-grace
// and longer after they go).
//
// CRI is not asked: its sandboxes are containerd containers of CRI's
// namespace (io.cri-containerd.kind=sandbox, made by its podsandbox
// controller, the only one gcagent supports), and this is the projection
// of that namespace, which holds every container there once synced
// (subscribe, then list, relist after every reconnect) and places each
// sandbox in its pod by the kubelet's uid label or, failing that, CRI's
// sandbox-uid annotation: it sees every sandbox CRI's uid label selector
// did. Nothing is judged before the projection is synced; a pod dir the
// kubelet made before its sandbox existed is a uid the projection does not
// know, kept for the grace from when the dir was first seen. Asking CRI
// per dir cost a call per dead pod dir per pass for ever (a dir kept as a
// mount point) and stalled a pass for 5 s per dir while CRI hung.
func (s logsState) PodState(uid string) (alive bool, goneSince time.Time, known bool) {
	s.view(func(st *projection.State) {
		if p := st.Pods[uid]; p != nil {
			alive, known = p.Alive(), true
			if !alive {
				goneSince = p.GoneAt
			}
		}
	})
	return alive, goneSince, known
}

func (c Config) logsConfig() logs.Config {
	return logs.Config{LogDir: c.LogDir, PodLogDir: c.PodLogDir, PodLogGrace: c.PodLogGrace, DryRun: c.DryRun}
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
	if nss, _ := a.cfg.namespaces(); !nss.Match(events.CRINamespace) {
		a.log.Info().Str("component", "logs").Str("namespaces", nss.String()).
			Msg("log cleanup off: the kubelet's logs belong to namespace " + events.CRINamespace + ", which is not managed")
		return nil
	}
	cl, err := logs.New(a.cfg.logsConfig(), liveLogsState(a.live), logs.Options{
		Deletes: a.deletes, Publisher: a.pub, Metrics: m, Logger: a.log, Now: a.clock.Now,
	})
	if err != nil {
		return err
	}
	a.logs, a.logsChanges = cl, a.live.Subscribe()
	return nil
}

// logsMinGap spaces the log passes projection changes ask for: a burst of
// events costs one pass (two directory scans) per gap, not one per event.
// A link that dangles is seen by fsnotify at once anyway.
const logsMinGap = 50 * time.Millisecond

// runLogs runs the cleaner and asks it for a pass on projection changes (a
// container exited or went, a pod went), at most once per logsMinGap,
// until ctx ends.
func (a *agent) runLogs(ctx context.Context) error {
	if a.logs == nil {
		<-ctx.Done()
		return nil
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.logs.Run(ctx) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-a.logsChanges:
				a.logs.Notify()
			}
			// Changes meanwhile coalesce in the channel: one Notify after.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(logsMinGap):
			}
		}
	})
	return g.Wait()
}

// planLogs plans the log dirs against s, deleting nothing (for `gcagent
// plan`). Entries count as first seen now, so unknown ones wait their grace.
func planLogs(cfg Config, s *projection.State) (logs.Plan, error) {
	cl, err := logs.New(cfg.logsConfig(), staticLogsState(s), logs.Options{})
	if err != nil {
		return logs.Plan{}, err
	}
	return cl.Plan()
}

// printLogsPlan prints a log plan for humans; names are quoted, as they may
// hold any byte.
func printLogsPlan(w io.Writer, cfg logs.Config, p logs.Plan) {
	remove := 0
	for _, d := range p.Decisions {
		if d.Action == logs.ActionRemove {
			remove++
		}
	}
	fmt.Fprint(w, "\nLOGS  ")
	if cfg.LogDir != "" {
		fmt.Fprintf(w, "log dir %s, pod log dir %s, grace %s, ", cfg.LogDir, cfg.PodLogDir, cfg.PodLogGrace)
	} else if !p.At.IsZero() {
		fmt.Fprintf(w, "last pass %s, ", p.At.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(w, "synced %v, dry run %v: %d to remove, %d kept or waiting\n", p.Synced, p.DryRun, remove, len(p.Decisions)-remove)
	if !p.Next.IsZero() {
		fmt.Fprintf(w, "next grace deadline: %s\n", p.Next.Format(time.RFC3339Nano))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tREASON\tKIND\tNAME\tDETAIL")
	for _, d := range p.Decisions {
		detail := d.Detail
		switch {
		case detail != "":
		case d.Action == logs.ActionWait:
			detail = "eligible at " + d.EligibleAt.Format(time.RFC3339Nano)
		case d.Container != "":
			detail = "container " + short(d.Container)
		case d.UID != "":
			detail = "pod " + d.UID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%q\t%s\n", d.Action, d.Reason, d.Kind, d.Name, detail)
	}
	tw.Flush()
}
