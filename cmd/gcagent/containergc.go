package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
)

// containerPolicy is the container GC policy the flags describe.
func (c Config) containerPolicy() gc.ContainerPolicy {
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
		Policy:    a.cfg.containerPolicy(),
		DryRun:    a.cfg.DryRun,
		Publisher: a.pub,
		Deletes:   a.deletes,
		Metrics:   m,
		Logger:    a.log,
		PodKept:   podLogDirExists(a.cfg.PodLogDir),
		Clock:     gc.SystemContainerClock(a.clock.Now),
		MinGap:    containerGCMinGap,
	})
	if err != nil {
		return err
	}
	a.containerGC = cgc
	return nil
}

// podLogDirExists says a pod is still there while the kubelet keeps its log
// dir (<pod-log-dir>/<namespace>_<name>_<uid>): it removes that dir only
// for pods that are gone.
func podLogDirExists(podLogDir string) func(uid, namespace, name string) bool {
	return func(uid, namespace, name string) bool {
		if uid == "" || namespace == "" || name == "" || strings.ContainsRune(namespace+name+uid, '/') {
			return false
		}
		st, err := os.Lstat(filepath.Join(podLogDir, namespace+"_"+name+"_"+uid))
		return err == nil && st.IsDir()
	}
}

// printContainerPlan prints a container plan for humans: what goes, what
// stays and why.
func printContainerPlan(w io.Writer, p gc.ContainerPolicy, plan gc.ContainerPlan) {
	fmt.Fprintf(w, "\nCONTAINERS  prune %s, minimum TTL %s, per container %d, in all %d: %d to remove, %d kept\n",
		p.Prune, p.MinAge, p.MaxPerEvictUnit, p.MaxContainers, len(plan.Remove), len(plan.Keep))
	if !plan.NextEligible.IsZero() {
		fmt.Fprintf(w, "next TTL expiry: %s\n", plan.NextEligible.Format(time.RFC3339Nano))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DECISION\tREASON\tNAMESPACE\tCONTAINER\tKIND\tSTATE\tPOD\tEXITED\tDETAIL")
	row := func(decision string, it gc.ContainerItem) {
		kind := it.CRIKind
		if kind == "" {
			kind = gc.ContainerKindNative
		}
		pod, exited, detail := "-", "-", it.EvictUnit
		if it.PodUID != "" {
			pod = it.PodNamespace + "/" + it.PodName
		}
		if !it.ExitedAt.IsZero() {
			exited = it.ExitedAt.Format(time.RFC3339)
		}
		switch {
		case !it.EligibleAt.IsZero():
			detail = "eligible at " + it.EligibleAt.Format(time.RFC3339Nano)
		case len(it.Containers) > 0:
			detail = "containers " + strings.Join(it.Containers, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", decision, it.Reason, it.Namespace, short(it.ID), kind, it.State, pod, exited, detail)
	}
	for _, it := range plan.Remove {
		row("remove", it)
	}
	for _, it := range plan.Keep {
		row("keep", it)
	}
	tw.Flush()
}

// printContainerGCStatus prints the running agent's container GC section.
func printContainerGCStatus(w io.Writer, st gc.ContainerGCStatus) {
	next := "not armed"
	if !st.NextTimer.IsZero() {
		next = st.NextTimer.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(w, "\ncontainer gc: synced %v, dry run %v, passes %d, removed %d, timer %s\n",
		st.Synced, st.DryRun, st.Passes, st.Removed, next)
	if st.Error != "" {
		fmt.Fprintf(w, "last pass errors: %s\n", st.Error)
	}
	printContainerPlan(w, st.Policy, st.Plan)
	if len(st.Results) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nLAST PASS\tCONTAINER\tKIND\tRE-CHECK\tAT\tERROR")
	for _, r := range st.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Outcome, short(r.ID), r.Kind, r.Live, r.At.Format(time.RFC3339Nano), r.Error)
	}
	tw.Flush()
}
