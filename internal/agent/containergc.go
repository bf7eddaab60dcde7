package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
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
	}
}

// podKept says a pod is still there while its log dir exists under dir
// (the kubelet removes it only for a deleted pod). Only "does not exist"
// counts as gone: any other error, a pod without a name, or a dir that
// cannot be read as a directory keep the pod, so that a pod log dir the
// agent does not see (not mounted, another --pod-log-dir) never makes a
// stopped pod look deleted. (The planner also refuses the sign while a
// running pod has no dir: gc.ContainerPlan.PodSignalBlind.)
func podKept(dir string) func(uid, namespace, name string) bool {
	return func(uid, namespace, name string) bool {
		if uid == "" || namespace == "" || name == "" || strings.ContainsRune(namespace+name+uid, '/') {
			return true
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return true
		}
		_, err := os.Lstat(filepath.Join(dir, namespace+"_"+name+"_"+uid))
		return !errors.Is(err, fs.ErrNotExist)
	}
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
	cgc, err := gc.NewContainerGC(gc.ContainerGCDeps{
		State: a.live, Changes: a.live.Subscribe(), Runtime: a.runtime, Deletes: a.deletes, Publisher: a.pub,
		PodKept: podKept(a.cfg.PodLogDir),
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
