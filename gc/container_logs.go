package gc

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
)

// ContainerLogs is schema.ContainerLogs: what goes with a CRI container.
type ContainerLogs = schema.ContainerLogs

// LogRemoval is schema.LogRemoval: one path removed, as log.removed says.
type LogRemoval = schema.LogRemoval

// ContainerLogRef names a CRI container's log as the kubelet finds it to
// remove it (removeContainerLog): CRI's log path for the container (its
// sandbox's log directory joined with the container's log path), and the
// kubelet's labels, which name its legacy link.
type ContainerLogRef struct {
	ID            string
	LogPath       string // from CRI's container status
	PodUID        string
	PodNamespace  string
	PodName       string
	ContainerName string
}

// containerLogFiles finds and removes the log files and the legacy link of
// a CRI container (logs.ContainerLogs): only under the pod log dir, in the
// pod's own dir, never following a link nor crossing a mount.
type containerLogFiles interface {
	// FindContainerLogs lists what RemoveContainerLogs would remove.
	FindContainerLogs(ref ContainerLogRef) (ContainerLogs, error)
	// RemoveContainerLogs removes them: what it removed, as a whole and
	// path by path (Kind, Dir, Name and Bytes set), and an error if a
	// file could not go (the container must stay, for a retry); what
	// went before that is returned with the error.
	RemoveContainerLogs(ref ContainerLogRef) (ContainerLogs, []LogRemoval, error)
}

// criLogPaths asks CRI for a container's log path.
type criLogPaths interface {
	// CRIContainerLogPath is the container's log path in CRI's status;
	// ErrContainerGone when CRI does not know it.
	CRIContainerLogPath(ctx context.Context, id string) (string, error)
}

// ErrContainerGone says CRI no longer knows the container.
var ErrContainerGone = errors.New("container gone")

// logRef is the log reference of item it with CRI's log path.
func logRef(it ContainerItem, path string) ContainerLogRef {
	return ContainerLogRef{ID: it.ID, LogPath: path, PodUID: it.PodUID, PodNamespace: it.PodNamespace, PodName: it.PodName,
		ContainerName: it.ContainerName}
}

// ShowContainerLogs fills in, for each CRI container plan removes, the log
// files and link its removal would remove (for plans and dry runs: it
// removes nothing). A container CRI cannot say of, or whose files cannot be
// listed, gets the reason in Kept.
func ShowContainerLogs(ctx context.Context, plan *ContainerPlan, rt criLogPaths, files containerLogFiles) {
	for i := range plan.Remove {
		it := &plan.Remove[i]
		if it.CRIKind != projection.KindContainer {
			continue
		}
		path, err := rt.CRIContainerLogPath(ctx, it.ID)
		if err != nil {
			it.Logs = &ContainerLogs{Kept: "log path not known: " + err.Error()}
			continue
		}
		found, err := files.FindContainerLogs(logRef(*it, path))
		if err != nil {
			found.Kept = err.Error()
		}
		it.Logs = &found
	}
}

// logsAlone publishes one log.removed per path removed with CRI container
// it whose own removal then did not happen, or whose outcome is not known
// yet: no removal goes unreported. Each says the container's reason and
// id, and in Error why the container stayed. The key is the path's and
// the container run's, so a retry that reports it again is one event. It
// logs one line with the paths (info), which the caller's own line about
// the container does not name.
func (e *ContainerExecutor) logsAlone(it ContainerItem, paths []LogRemoval, why string) {
	if len(paths) == 0 {
		return
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Join(p.Dir, p.Name))
	}
	e.event(e.log.Info(), it, ContainerKindContainer).Strs("log_paths", names).Str("why", why).
		Msg("its log went, the container stays: each path reported on its own")
	at := e.now()
	for _, p := range paths {
		p.Reason, p.Container, p.UID, p.Namespace, p.At, p.Error = it.Reason, it.ID, it.PodUID, it.Namespace, at, why
		subject := filepath.Join(p.Dir, p.Name)
		if err := e.pub.Publish(Action{Kind: schema.KindLog, Action: ActionRemoved, Subject: subject,
			Key: "with-container:" + subject + "@" + ContainerRemovalKey(it.ID, it.ExitedAt), Data: p}); err != nil {
			e.opts.Metrics.error("publish")
			e.log.Warn().Str("path", subject).Err(err).Msg("publish the log's removal")
		}
	}
}

// logsEvent adds what went (or goes) with a CRI container to a log line.
func logsEvent(ev *zerolog.Event, l *ContainerLogs) *zerolog.Event {
	if l == nil {
		return ev
	}
	ev = ev.Strs("log_files", l.Files).Int64("log_bytes", l.Bytes)
	if l.Link != "" {
		ev = ev.Str("log_link", l.Link)
	}
	if l.Kept != "" {
		ev = ev.Str("log_kept", l.Kept)
	}
	return ev
}
