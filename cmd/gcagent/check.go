package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
)

// checkHelp is the help of `gcagent check`.
var checkHelp = help{Usage: "gcagent check [flags] [--json]", Env: "all",
	About: "Preflight of this node for the agent, one line each (OK, WARN or FAIL):\n" +
		"containerd and its version, CRI, the namespaces found and managed, the image\n" +
		"filesystem against the thresholds, the log dirs, the state dir, the kubelet's\n" +
		"config (--kubelet-config, else /var/lib/kubelet/config.yaml when present),\n" +
		"NATS and the clock. Exit status 1 on any FAIL. It takes run's flags,\n" +
		"environment and config file, so that it checks what run would use, plus\n" +
		"--json (an array of {name, status, detail}). It deletes nothing."}

// errCheckFailed: a check failed (exit status 1); the lines said which.
type errCheckFailed struct{ n int }

func (e errCheckFailed) Error() string { return fmt.Sprintf("check: %d FAIL", e.n) }

// checkCmd runs `gcagent check`.
func checkCmd(ctx context.Context, args []string, env func(string) string, stdout io.Writer) error {
	rest, asJSON, err := splitJSONFlag(args)
	if err != nil {
		return usageError{err}
	}
	cfg, err := parseRun(rest, env, checkHelp, stdout)
	if err != nil {
		return err
	}
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
