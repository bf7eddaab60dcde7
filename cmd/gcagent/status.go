package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/projection"
	"github.com/spf13/cobra"
)

// statusCmd is `gcagent status`: a running agent's projection.
func (c *cli) statusCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	asJSON, address := false, ""
	cmd := &cobra.Command{
		Use:   "status [flags]",
		Short: "print a running agent's projection, disk and policy",
		Long: "Prints a running agent's projection, disk and policy, from its /status endpoint\n" +
			"at --metrics-address (GCAGENT_METRICS_ADDRESS, as set for the agent, e.g. in its\n" +
			"pod, is the default).",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("address") && !cmd.Flags().Changed("metrics-address") {
				fmt.Fprintln(c.stderr, "gcagent: status: --address is deprecated, use --metrics-address (the agent's flag, as every command names it)")
				if err := cmd.Flags().Set("metrics-address", address); err != nil {
					return usagef("status: --address: %v", err)
				}
			}
			if _, err := c.settle(cmd.Flags()); err != nil {
				return err
			}
			return status(cmd.Context(), cfg.MetricsAddress, asJSON, c.stdout)
		},
	}
	flagvalue.Add(cmd.Flags(), flagvalue.Bool{P: &asJSON}, "json", "print the raw /status document")
	addConfigFlag(cmd, &cfg)
	agent.EndpointFlags.AddTo(cmd.Flags(), &cfg, "metrics-address")
	cmd.Flags().StringVar(&address, "address", "", "the agent's --metrics-address")
	cmd.Flags().Lookup("address").Hidden = true // deprecated: said when used
	setEnvHelp(cmd, envShared)
	return cmd
}

// status asks the agent at addr for its projection and prints it.
func status(ctx context.Context, addr string, asJSON bool, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return usagef("invalid --metrics-address %q: %v", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("status: no agent at %s (nothing listens there): is gcagent run running, and is this its --metrics-address?", addr)
	}
	if err != nil {
		return fmt.Errorf("agent at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent at %s: %s", addr, resp.Status)
	}
	if asJSON {
		_, err = stdout.Write(body)
		return err
	}
	var doc agent.StatusDoc
	if err := json.Unmarshal(body, &doc); err != nil {
		return fmt.Errorf("agent at %s: bad /status: %w", addr, err)
	}
	printReport(stdout, doc.Report)
	printPolicy(stdout, doc.Policy)
	if doc.ImageGC != nil {
		printImageGCStatus(stdout, *doc.ImageGC)
	}
	if doc.ContainerGC != nil {
		printContainerGCStatus(stdout, *doc.ContainerGC)
	}
	if doc.Logs != nil {
		printLogsPlan(stdout, logs.Config{}, *doc.Logs)
	}
	return nil
}

// printImageGCStatus prints image GC's thresholds, disk and last pass.
func printImageGCStatus(w io.Writer, st gc.ImageGCStatus) {
	fmt.Fprintf(w, "\nimage gc: usage %d%% (high %d%%, low %d%%) of %s, %s free; dry run %v; passes %d; sandbox images %s\n",
		st.Usage, st.High, st.Low, humanBytes(int64(st.Disk.CapacityBytes)), humanBytes(int64(st.Disk.AvailableBytes)),
		st.DryRun, st.Passes, strings.Join(st.SandboxImages, ","))
	if !st.NextAgeOut.IsZero() {
		fmt.Fprintf(w, "  next age-out: %s\n", st.NextAgeOut.Format(time.RFC3339))
	}
	if p := st.LastPass; p != nil {
		fmt.Fprintf(w, "  last pass %s (%s): usage %d%% -> %d%%, removed %d, skipped %d, estimated %s, measured %s freed",
			p.Start.Format(time.RFC3339), p.Trigger, p.Usage, p.UsageAfter, len(p.Removed), len(p.Skipped),
			humanBytes(p.EstimatedBytes), humanBytes(p.FreedBytes))
		if p.Error != "" {
			fmt.Fprintf(w, ", error: %s", p.Error)
		}
		fmt.Fprintln(w)
	}
}

func printReport(w io.Writer, rep projection.Report) {
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		d := rep.At.Sub(t).Round(time.Second)
		if d <= 0 {
			return "now"
		}
		return d.String() + " ago"
	}
	fmt.Fprintf(w, "namespaces: %s  synced: %v  events applied: %d  images: %d  containers: %d  pods: %d\n\n",
		strings.Join(rep.Namespaces, ","), rep.Synced, rep.Seq, len(rep.Images), len(rep.Containers), len(rep.Pods))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tIMAGE\tDIGEST\tSIZE\tFIRST SEEN\tLAST USED\tUSERS\tPINNED")
	for _, img := range rep.Images {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%v\n", img.Namespace, displayNames(img.Names), projection.ShortDigest(img.Digest),
			humanBytes(img.Size), ago(img.FirstSeen), ago(img.LastUsed), len(img.Users), img.Pinned)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCONTAINER\tKIND\tSTATE\tEXITED\tIMAGE\tEVICT UNIT")
	for _, c := range rep.Containers {
		exited := "-"
		if c.ExitedAt != nil {
			exited = fmt.Sprintf("%s (status %d)", ago(*c.ExitedAt), c.ExitStatus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Namespace, short(c.ID), c.Kind, c.State, exited, c.Image, c.EvictUnit)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD UID\tPOD NAMESPACE/NAME\tALIVE\tSANDBOXES")
	for _, p := range rep.Pods {
		fmt.Fprintf(tw, "%s\t%s/%s\t%v\t%d\n", p.UID, p.Namespace, p.Name, p.Alive, len(p.Sandboxes))
	}
	tw.Flush()
}

// displayNames joins an image's names, leaving out CRI's sha256:<config>
// id name when the image has another.
func displayNames(names []string) string {
	var shown []string
	for _, n := range names {
		if !strings.HasPrefix(n, "sha256:") {
			shown = append(shown, n)
		}
	}
	if len(shown) == 0 {
		shown = names
	}
	return strings.Join(shown, ",")
}

func short(id string) string {
	if len(id) > 20 {
		return id[:20]
	}
	return id
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
