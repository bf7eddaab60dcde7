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
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/projection"
)

// planCmd runs `gcagent plan`: a one-shot dry run against the local
// containerd. It takes run's flags (and environment and config file) plus
// --json, lists containerd, and prints what image GC would do now and why.
// It deletes nothing and needs no running agent.
func planCmd(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	rest, asJSON, err := splitJSONFlag(args)
	if err != nil {
		return usageError{err}
	}
	cfg, err := parseRun(rest, env, planHelp, stdout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	doc, err := askAgentPlan(ctx, cfg.MetricsAddress)
	switch {
	case errors.Is(err, errNoAgent):
		doc, err = agent.BuildPlan(ctx, cfg)
	case err == nil:
		if d := policyDiff(cfg.Policy(), doc.Policy); d != "" {
			doc.HistoryNote += "; the agent's policy, not this command's: " + d
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

// errNoAgent: nothing listens on the agent's metrics address.
var errNoAgent = errors.New("no agent answers")

// askAgentPlan asks a running agent for its own plan (GET /plan on its
// metrics address): with an agent running, plan prints exactly what that
// agent decides. errNoAgent when none listens there.
func askAgentPlan(ctx context.Context, addr string) (agent.Plan, error) {
	var doc agent.Plan
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return doc, err
	}
	if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + "/plan"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return doc, err
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return doc, errNoAgent
	}
	if err != nil {
		return doc, fmt.Errorf("agent at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return doc, fmt.Errorf("%s listens on %s but has no /plan: an older agent, or not gcagent", url, addr)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return doc, fmt.Errorf("agent at %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return doc, fmt.Errorf("agent at %s: bad plan: %w", url, err)
	}
	return doc, nil
}

// policyDiff names the settings whose values differ between mine and the
// agent's; empty when they agree.
func policyDiff(mine, agents []agent.Setting) string {
	theirs := map[string]string{}
	for _, s := range agents {
		theirs[s.Name] = s.Value
	}
	var diffs []string
	for _, s := range mine {
		if v, ok := theirs[s.Name]; ok && v != s.Value {
			diffs = append(diffs, fmt.Sprintf("%s=%s (given %s)", s.Name, v, s.Value))
		}
	}
	return strings.Join(diffs, ", ")
}

// splitJSONFlag takes --json (-json, --json=BOOL) out of args, so that the
// rest parses with run's flag set.
func splitJSONFlag(args []string) ([]string, bool, error) {
	var rest []string
	asJSON := false
	for i, a := range args {
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			rest = append(rest, a)
			continue
		}
		asJSON = true
		if hasVal {
			b, err := strconv.ParseBool(val)
			if err != nil {
				return nil, false, fmt.Errorf("invalid --json %q: %v", val, err)
			}
			asJSON = b
		}
	}
	return rest, asJSON, nil
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
	for _, n := range doc.KubeletNotes {
		fmt.Fprintf(w, "kubelet: %s\n", n)
	}
	printPolicy(w, doc.Policy)
	printImagePlan(w, doc)
	printContainerPlan(w, doc.ContainerPolicy, doc.Containers)
	printLogsPlan(w, doc.LogsConfig, doc.Logs)
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
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DECISION\tREASON\tNAMESPACE\tIMAGE\tDIGEST\tSIZE\tFIRST SEEN\tLAST USED\tDETAIL")
	row := func(decision string, it gc.ImageItem) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", decision, it.Reason, it.Namespace, strings.Join(it.Names, ","),
			projection.ShortDigest(it.Digest), humanBytes(it.Size), ago(it.FirstSeen), ago(it.LastUsed), detail)
	}
	for _, it := range p.Delete {
		row("delete", it)
	}
	for _, it := range p.Keep {
		row("keep", it)
	}
	tw.Flush()
	if why := p.Shortfall(); why != "" {
		fmt.Fprintf(w, "\nshort of the low threshold: %s\n", why)
	}
	if doc.Next != nil {
		fmt.Fprintf(w, "at %s, if the disk stays as it is, a pass deletes:", doc.Next.Now.Format(time.RFC3339))
		for _, it := range doc.Next.Delete {
			fmt.Fprintf(w, " %s", cmp.Or(firstOf(it.Names), projection.ShortDigest(it.Digest)))
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
