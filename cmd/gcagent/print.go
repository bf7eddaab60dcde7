package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
)

// printContainerPlan prints a container plan for humans: what goes, what
// stays and why.
func printContainerPlan(w io.Writer, p gc.ContainerPolicy, plan gc.ContainerPlan) {
	fmt.Fprintf(w, "\nCONTAINERS  prune %s, minimum TTL %s, per container %d, in all %d: %d to remove, %d kept\n",
		p.Prune, p.MinAge, p.MaxPerEvictUnit, p.MaxContainers, len(plan.Remove), len(plan.Keep))
	if !plan.NextEligible.IsZero() {
		fmt.Fprintf(w, "next TTL expiry: %s\n", plan.NextEligible.Format(time.RFC3339Nano))
	}
	if len(plan.Remove) > 0 {
		fmt.Fprintln(w, "removed in ORDER: in each namespace, containers before sandboxes, the oldest created first")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tDECISION\tREASON\tNAMESPACE\tCONTAINER\tKIND\tSTATE\tPOD\tEXITED\tDETAIL")
	row := func(order, decision string, it gc.ContainerItem) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", order, decision, it.Reason, it.Namespace, short(it.ID), kind, it.State, pod, exited, detail)
	}
	for i, it := range plan.Remove {
		row(strconv.Itoa(i+1), "remove", it)
	}
	for _, it := range plan.Keep {
		row("-", "keep", it)
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
		fmt.Fprintf(w, "log dir %s, pod log dir %s, ", cfg.LogDir, cfg.PodLogDir)
		if cfg.HostPodLogDir != "" {
			fmt.Fprintf(w, "on the host %s, ", cfg.HostPodLogDir)
		}
		fmt.Fprintf(w, "grace %s, ", cfg.PodLogGrace)
	} else if !p.At.IsZero() {
		fmt.Fprintf(w, "last pass %s, ", p.At.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(w, "synced %v, dry run %v: %d to remove, %d kept or waiting\n", p.Synced, p.DryRun, remove, len(p.Decisions)-remove)
	if by := p.PodLogDir.By; by != logs.Unverified {
		fmt.Fprintf(w, "pod log dir: verified by %s: %s\n", by, p.PodLogDir.Detail)
	} else if p.PodLogDir.Detail != "" {
		fmt.Fprintf(w, "pod log dir: not verified: %s\n", p.PodLogDir.Detail)
	}
	for _, pr := range p.Problems {
		fmt.Fprintf(w, "kept: %s\n", pr)
	}
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
