package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/spf13/cobra"
)

// errCheckFailed: a check failed (exit status 1); the lines said which.
type errCheckFailed struct{ n int }

func (e errCheckFailed) Error() string { return fmt.Sprintf("check: %d FAIL", e.n) }

// checkCmd is `gcagent check`: the preflight of this node.
func (c *cli) checkCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	asJSON := false
	cmd := &cobra.Command{
		Use:   "check [flags]",
		Short: "preflight of this node: containerd, CRI, disks, log and state dirs, kubelet, NATS, clock",
		Long: "Preflight of this node for the agent, one line each (OK, WARN or FAIL):\n" +
			"containerd and its version, CRI, the namespaces found and managed, the image\n" +
			"filesystem against the thresholds, the log dirs, the state dir, the kubelet's\n" +
			"config (--kubelet-config, else /var/lib/kubelet/config.yaml when present),\n" +
			"NATS and the clock. Exit status 1 on any FAIL. It takes run's flags,\n" +
			"environment and config file, so that it checks what run would use. It deletes\n" +
			"nothing.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.settleRun(cmd, &cfg); err != nil {
				return err
			}
			return check(cmd.Context(), cfg, asJSON, c.stdout)
		},
	}
	flagvalue.Add(cmd.Flags(), flagvalue.Bool{P: &asJSON}, "json", "print an array of {name, status, detail}")
	addRunFlags(cmd, &cfg, nil)
	setEnvHelp(cmd, envAll)
	return cmd
}

// check runs the checks and prints them.
func check(ctx context.Context, cfg agent.Config, asJSON bool, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	results := agent.Checks(ctx, cfg)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Status, r.Name, r.Detail)
		}
		tw.Flush()
	}
	failed := 0
	for _, r := range results {
		if r.Status == agent.CheckFail {
			failed++
		}
	}
	if failed > 0 {
		return errCheckFailed{failed}
	}
	return nil
}
