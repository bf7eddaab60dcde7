package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/projection"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// planShows are the flags of run that plan reads. It takes run's others
// too, hidden in its help, so that run's command line can be given to it
// as is.
var planShows = []string{"config",
	"image-gc-high-threshold", "image-gc-low-threshold", "minimum-image-ttl-duration", "image-maximum-gc-age",
	"keep-image", "sandbox-image", "image-fs", "kubelet-config",
	"prune-containers", "minimum-container-ttl-duration", "maximum-dead-containers-per-container",
	"maximum-dead-containers", "uncollected-exit-grace",
	"log-dir", "pod-log-dir", "host-pod-log-dir", "pod-log-grace", "kubelet-status-lag",
	"containerd-address", "namespace", "exclude-namespace", "state-dir", "cluster", "metrics-address"}

// planCmd is `gcagent plan`: what GC would delete now, in order, and why.
// It takes run's flags (and environment and config file) plus --json,
// deletes nothing and needs no running agent.
func (c *cli) planCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	asJSON := false
	cmd := &cobra.Command{
		Use:   "plan [flags]",
		Short: "what GC would delete now, in order, and why, and the policy in force (deletes nothing)",
		Long: "Prints what the agent would delete now, in the order it deletes, and why, and\n" +
			"the policy in force with where each setting came from; deletes nothing.\n\n" +
			"With an agent running (at --metrics-address), plan asks it: the plan comes from\n" +
			"the agent's own history. The policy settings given here (flag, environment or\n" +
			"file) that differ from the agent's are planned as given, as a what-if, while\n" +
			"the agent goes on with its own: `gcagent plan --image-gc-high-threshold=70`.\n" +
			"Without an agent, plan reads the agent's state dir, or applies the agent's\n" +
			"first-start rule, and says which (history).\n\n" +
			"It also takes run's other flags (not listed), so that run's command line can\n" +
			"be given as is.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			moved, err := c.settleWhatIf(cmd, &cfg)
			if err != nil {
				return err
			}
			return plan(cmd.Context(), cfg, moved, asJSON, c.stdout)
		},
	}
	flagvalue.Add(cmd.Flags(), flagvalue.Bool{P: &asJSON}, "json", "print the plan as JSON (each delete list in the order of deletion)")
	addRunFlags(cmd, &cfg, planShows)
	setEnvHelp(cmd, envAll)
	return cmd
}

// addRunFlags adds every flag of run to cmd, bound to cfg; with shows,
// the others are hidden from its help.
func addRunFlags(cmd *cobra.Command, cfg *agent.Config, shows []string) {
	for _, g := range agent.RunFlags {
		g.AddTo(cmd.Flags(), cfg)
	}
	if shows == nil {
		return
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if readsSettings(f) && !slices.Contains(shows, f.Name) {
			f.Hidden = true
		}
	})
}

// plan prints the plan of the agent at cfg.MetricsAddress, by cfg's policy
// where it was given, or without one the plan from the node and the state
// dir. An agent there that watches another containerd or state dir than
// the ones given is not asked: the plan is made here, from those given.
// moved says what a high threshold given alone moved (settleWhatIf).
func plan(ctx context.Context, cfg agent.Config, moved string, asJSON bool, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	doc, err := askAgentPlan(ctx, cfg.MetricsAddress, cfg.SettingValues(givenPolicy(cfg)))
	local := ""
	switch {
	case errors.Is(err, errNoAgent):
		local = moved
	case err == nil:
		if other := elsewhere(cfg, doc); other != "" {
			local = fmt.Sprintf("not the plan of the agent at %s, which watches %s: planned here from those given", cfg.MetricsAddress, other)
			local = strings.TrimSuffix(local+"; "+moved, "; ")
		} else if d := policyDiff(cfg, doc.Policy); d != "" {
			doc.HistoryNote += "; the agent's policy, not this command's: " + d
		}
	}
	if errors.Is(err, errNoAgent) || local != "" {
		doc, err = agent.BuildPlan(ctx, cfg)
		if local != "" {
			doc.HistoryNote = strings.TrimPrefix(doc.HistoryNote+"; "+local, "; ")
		}
	}
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	printPlan(stdout, doc)
	return nil
}

// elsewhere names where the agent that answered looks, when it is not the
// containerd (--containerd-address) or the state dir (--state-dir) given
// to this command: its plan would be another node's. "" when it is.
func elsewhere(cfg agent.Config, doc agent.Plan) string {
	var out []string
	differs := func(name, mine, theirs string) bool {
		return cfg.Sources[name] != "" && theirs != "" && cleanPath(mine) != cleanPath(theirs)
	}
	if differs("containerd-address", cfg.ContainerdAddress, doc.Containerd) {
		out = append(out, fmt.Sprintf("containerd %s, not %s", doc.Containerd, cfg.ContainerdAddress))
	}
	if differs("state-dir", cfg.StateDir, doc.StateDir) {
		out = append(out, fmt.Sprintf("state dir %s, not %s", doc.StateDir, cfg.StateDir))
	}
	return strings.Join(out, ", and ")
}

// cleanPath is a socket or dir path as compared: without unix:// and
// trailing slashes.
func cleanPath(p string) string {
	return filepath.Clean(strings.TrimPrefix(p, "unix://"))
}

// givenPolicy names the policy settings of cfg that were given (not
// defaults, nor taken from the kubelet's config: the running agent took
// those at its start) and that a running agent plans by as given when they
// differ from its own, or refuses (where it looks: its namespaces).
func givenPolicy(cfg agent.Config) []string {
	var out []string
	for _, s := range cfg.Policy() {
		if given(s) && (slices.Contains(agent.WhatIfSettings, s.Name) || s.Name == "namespace" || s.Name == "exclude-namespace") {
			out = append(out, s.Name)
		}
	}
	return out
}

// given reports whether s was given to this command: by flag, variable or
// file line. A default is not, nor a value taken from the kubelet's
// config: in the agent's pod `plan` reads the same file, which may have
// changed since the agent's start (the agent takes it again at its next).
func given(s agent.Setting) bool {
	return s.Source != "default" && !strings.HasPrefix(s.Source, "kubelet-config ") && !strings.HasPrefix(s.Source, agent.MovedSource)
}

// errNoAgent: nothing listens on the agent's metrics address.
var errNoAgent = errors.New("no agent answers")

// askAgentPlan asks a running agent for its own plan (GET /plan on its
// metrics address): with an agent running, plan prints exactly what that
// agent decides. errNoAgent when none listens there.
func askAgentPlan(ctx context.Context, addr string, whatIf url.Values) (agent.Plan, error) {
	var doc agent.Plan
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return doc, err
	}
	if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		host = "127.0.0.1"
	}
	endpoint := "http://" + net.JoinHostPort(host, port) + "/plan"
	query := ""
	if len(whatIf) > 0 {
		query = "?" + whatIf.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+query, nil)
	if err != nil {
		return doc, err
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return doc, errNoAgent
	}
	if err != nil {
		return doc, fmt.Errorf("agent at %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return doc, fmt.Errorf("%s listens on %s but has no /plan: an older agent, or not gcagent", endpoint, addr)
	}
	if resp.StatusCode == http.StatusBadRequest {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return doc, usagef("the agent at %s: %s", addr, strings.TrimSpace(string(body)))
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return doc, fmt.Errorf("agent at %s: %s: %s", endpoint, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return doc, fmt.Errorf("agent at %s: bad plan: %w", endpoint, err)
	}
	return doc, nil
}

// policyDiff names the settings given to mine (not defaults) whose values
// differ from the agent's: an agent that plans only by its own policy
// (older than what-if plans) answered. Empty when they agree.
func policyDiff(mine agent.Config, agents []agent.Setting) string {
	theirs := map[string]string{}
	for _, s := range agents {
		theirs[s.Name] = s.Value
	}
	var diffs []string
	for _, s := range mine.Policy() {
		if v, ok := theirs[s.Name]; ok && v != s.Value && given(s) {
			diffs = append(diffs, fmt.Sprintf("%s=%s (given %s)", s.Name, v, s.Value))
		}
	}
	return strings.Join(diffs, ", ")
}

// printPlan prints the plan for humans, one section per kind.
func printPlan(w io.Writer, doc agent.Plan) {
	fmt.Fprintf(w, "containerd %s, namespaces %s (--namespace %s), at %s\n", doc.Containerd, strings.Join(doc.Namespaces, ","),
		doc.Namespace, doc.At.Format(time.RFC3339))
	fmt.Fprintf(w, "history: %s", doc.History)
	if doc.HistoryNote != "" {
		fmt.Fprintf(w, " (%s)", doc.HistoryNote)
	}
	fmt.Fprintln(w)
	if len(doc.WhatIf) > 0 {
		fmt.Fprintf(w, "WHAT IF: planned with %s as given here; the agent runs on with its own (POLICY says which)\n", strings.Join(doc.WhatIf, ", "))
	}
	if slices.ContainsFunc(doc.Policy, func(s agent.Setting) bool { return s.Name == "dry-run" && s.Value == "true" }) {
		fmt.Fprintln(w, "DRY RUN: the agent deletes nothing (--dry-run); below is what a run would delete")
	}
	for _, n := range doc.KubeletNotes {
		fmt.Fprintf(w, "kubelet: %s\n", n)
	}
	printPolicy(w, doc.Policy)
	printImagePlan(w, doc)
	printContainerPlan(w, doc.ContainerPolicy, doc.Containers)
	printLogsPlan(w, doc.LogsConfig, doc.Logs)
	printFailClosed(w, doc.FailClosed)
}

// printFailClosed says what the plan keeps only because an input is
// unknown or stale (nothing printed when none).
func printFailClosed(w io.Writer, kept []agent.FailClosedKept) {
	if len(kept) == 0 {
		return
	}
	fmt.Fprintln(w, "\nKEPT ONLY BECAUSE AN INPUT IS NOT KNOWN (fail closed: cleaned once it is)")
	for _, k := range kept {
		fmt.Fprintf(w, "  %d %s(s): %s %s\n", k.Count, k.Kind, k.Input, k.Why)
	}
}

func printImagePlan(w io.Writer, doc agent.Plan) {
	p := doc.Images
	fmt.Fprintf(w, "\nIMAGES  filesystem %s: ", doc.ImageFS)
	if p.InvalidCapacity {
		fmt.Fprintln(w, "capacity 0: threshold GC cannot run")
	} else {
		fmt.Fprintf(w, "%d%% used (%s of %s available)\n", p.Usage, humanBytes(int64(p.Disk.AvailableBytes)), humanBytes(int64(p.Disk.CapacityBytes)))
	}
	if p.Triggered {
		fmt.Fprintf(w, "threshold GC: triggered, %s to free; %d image(s) to delete, %s estimated",
			humanBytes(p.AmountToFree), len(p.Delete), humanBytes(p.EstimatedBytes))
		if p.EstimatedBytes < p.AmountToFree {
			fmt.Fprint(w, " (not enough: deleting every eligible image does not reach the low threshold)")
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "threshold GC: not triggered; %d image(s) to delete by max age\n", len(p.Delete))
	}
	if !p.NextAgeOut.IsZero() {
		fmt.Fprintf(w, "next max-age deadline: %s\n", p.NextAgeOut.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "sandbox images: %s\n\n", strings.Join(doc.SandboxImages, ", "))
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		if d := p.Now.Sub(t).Round(time.Second); d > 0 {
			return d.String() + " ago"
		}
		return "now"
	}
	if len(p.Delete) > 0 {
		fmt.Fprintln(w, "deleted in ORDER: images past --image-maximum-gc-age first, then for space the least recently used first")
		fmt.Fprintln(w, "(an image never used by when it was first seen), until the low threshold is reached")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tDECISION\tREASON\tNAMESPACE\tIMAGE\tDIGEST\tSIZE\tFIRST SEEN\tLAST USED\tDETAIL")
	row := func(order, decision string, it gc.ImageItem) {
		detail := it.Rule
		switch {
		case len(it.Users) > 0:
			detail = "users " + strings.Join(it.Users, ",")
		case !it.EligibleAt.IsZero():
			detail = "eligible at " + it.EligibleAt.Format(time.RFC3339)
		case it.Name != "" && it.Rule != "":
			detail = it.Name + " ~ " + it.Rule
		case it.Name != "":
			detail = it.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", order, decision, it.Reason, it.Namespace, strings.Join(it.Names, ","),
			projection.ShortDigest(it.Digest), humanBytes(it.Size), ago(it.FirstSeen), ago(it.LastUsed), detail)
	}
	for i, it := range p.Delete {
		row(strconv.Itoa(i+1), "delete", it)
	}
	for _, it := range p.Keep {
		row("-", "keep", it)
	}
	tw.Flush()
	if why := p.Shortfall(); why != "" {
		fmt.Fprintf(w, "\nshort of the low threshold: %s\n", why)
	}
	if doc.Next != nil {
		fmt.Fprintf(w, "at %s, if the disk stays as it is, a pass deletes in this order:", doc.Next.Now.Format(time.RFC3339))
		for i, it := range doc.Next.Delete {
			fmt.Fprintf(w, " %d. %s", i+1, cmp.Or(firstOf(it.Names), projection.ShortDigest(it.Digest)))
		}
		fmt.Fprintln(w)
	}
}

// printPolicy prints the settings in force and where each came from.
func printPolicy(w io.Writer, policy []agent.Setting) {
	fmt.Fprintln(w, "\nPOLICY")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range policy {
		v := s.Value
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Name, v, s.Source)
	}
	tw.Flush()
}

func firstOf(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[0]
}
