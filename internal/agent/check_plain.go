package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/node"
)

// checkPlainContainers says what container GC does to the plain containers
// (no CRI kind: a `ctr run -d`, a nerdctl debug container) of the managed
// namespaces, with how many have exited now. On a kubelet node this is new
// behaviour: the kubelet leaves them alone, the agent removes each exited
// one once its client is done (--uncollected-exit-grace after its exit)
// and --minimum-container-ttl-duration has passed, unless
// --prune-containers=off. It is information (OK): nothing is wrong.
func checkPlainContainers(ctx context.Context, cfg Config, f nodeFacts) CheckResult {
	const name = "plain-containers"
	nss, _ := cfg.Namespaces()
	var managed []string
	for _, ns := range f.namespaces {
		if nss.Match(ns) {
			managed = append(managed, ns)
		}
	}
	if f.nsErr != nil || len(managed) == 0 {
		return okLine(name, "no managed namespace to count them in")
	}
	exited, err := countExitedPlain(ctx, cfg.ContainerdAddress, managed)
	if err != nil {
		return warnLine(name, "cannot count the exited plain containers: %s", errText(err))
	}
	slices.Sort(managed)
	now := fmt.Sprintf("%d exited now in %s", exited, strings.Join(managed, ","))
	if gc.PruneMode(cfg.PruneContainers) == gc.PruneOff {
		return okLine(name, "%s; kept: --prune-containers=off", now)
	}
	grace := cfg.UncollectedExitGrace
	if grace <= 0 {
		grace = gc.DefaultUncollectedGrace
	}
	return okLine(name, "%s; the agent removes each plain container (no CRI kind: ctr run, nerdctl) %s after its exit "+
		"when its client has not deleted it, plus --minimum-container-ttl-duration %s; the kubelet never does: "+
		"--prune-containers=off keeps them", now, grace, cfg.MinimumContainerTTL)
}

// criKindLabel marks a CRI container or sandbox; a plain one has none.
const criKindLabel = "io.cri-containerd.kind"

// countExitedPlain counts, over namespaces, the containers without a CRI
// kind whose task has stopped.
func countExitedPlain(ctx context.Context, address string, nss []string) (int, error) {
	cl, err := client.New(address, node.ClientOpts()...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	n := 0
	for _, ns := range nss {
		cctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, ns), checkTimeout)
		ctrs, err := cl.ContainerService().List(cctx)
		if err != nil {
			cancel()
			return 0, err
		}
		plain := map[string]bool{}
		for _, c := range ctrs {
			if c.Labels[criKindLabel] == "" {
				plain[c.ID] = true
			}
		}
		resp, err := cl.TaskService().List(cctx, &tasksapi.ListTasksRequest{})
		cancel()
		if err != nil {
			return 0, err
		}
		for _, t := range resp.Tasks {
			if plain[t.ID] && t.Status == task.Status_STOPPED {
				n++
			}
		}
	}
	return n, nil
}
