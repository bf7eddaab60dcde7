package main

import (
	"io"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/replay"
	"github.com/gcagent/gcagent/trace"
	"github.com/spf13/cobra"
)

// replayShows are the flags of run that replay reads (the image GC policy
// and where the trace is); it takes run's others too, hidden, so that run's
// command line can be given as is.
var replayShows = []string{"config",
	"image-gc-high-threshold", "image-gc-low-threshold", "minimum-image-ttl-duration", "image-maximum-gc-age",
	"keep-image", "sandbox-image", "state-dir", "metrics-address"}

// traceSource is where a command reads the trace from: --trace FILE (-
// for standard input), else the agent at --metrics-address, else the state
// file in --state-dir.
func traceSource(file string, cfg agent.Config, stdin io.Reader) trace.Source {
	src := trace.Source{File: file, Agent: cfg.MetricsAddress, StateDir: cfg.StateDir}
	if file == "-" {
		src.Stdin = stdin
	}
	return src
}

// replayCmd is `gcagent replay` (replay.Command): image GC simulated over
// the node's usage trace, by the policy the trace recorded, changed where
// run's flags are given.
func (c *cli) replayCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	var file, sweep, order string
	var asJSON, detail bool
	cmd := &cobra.Command{
		Use:   "replay [flags]",
		Short: "what an image GC policy would have done over the node's usage trace",
		Long: "Simulates image GC over the node's usage trace and prints what the policy would\n" +
			"have deleted and re-pulled, how long the disk stayed above the high threshold and\n" +
			"how full it got, next to what really happened. The trace is --trace FILE (JSON\n" +
			"lines, as trace export writes; - for standard input), else the agent's at\n" +
			"--metrics-address, else the state file in --state-dir. Of run's flags, those\n" +
			"given change the policy the trace recorded; the others follow it.\n\n" +
			"  gcagent replay --minimum-image-ttl-duration=1h\n" +
			"  gcagent replay --sweep image-gc-high-threshold=70..95:5",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A high threshold given alone: the recorded low one follows it
			// (replay.Given), not the default that settling moved.
			if _, err := c.settleWhatIf(cmd, &cfg); err != nil {
				return err
			}
			given := func(flag string) bool {
				return cfg.Sources[flag] != "" && !strings.HasPrefix(cfg.Sources[flag], agent.MovedSource)
			}
			o := replay.CommandOptions{
				Source:   traceSource(file, cfg, c.stdin),
				Policy:   replay.Given(cfg.ImagePolicy(), given),
				LowGiven: given(replay.FlagLow),
				Order:    order, Sweep: sweep, JSON: asJSON, Detail: detail,
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			return replay.Command(cmd.Context(), o, c.stdout, c.stderr)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&file, "trace", "", "the trace `file` to replay (JSON lines, as trace export writes; - for standard input)")
	fs.StringVar(&sweep, "sweep", "", "replay once per value of one flag, `FLAG=A..B[:STEP]` (image-gc-high-threshold, image-gc-low-threshold: percents, step 1; minimum-image-ttl-duration, image-maximum-gc-age: durations, step needed), and print the frontier of re-pulls against free space")
	fs.StringVar(&order, "order", "lru", "deletion order of threshold GC: lru (the kubelet's and the agent's) or gdsf (cost-aware Greedy-Dual-Size-Frequency, for comparison: the agent deletes by lru)")
	flagvalue.Add(fs, flagvalue.Bool{P: &asJSON}, "json", "print the result as JSON")
	flagvalue.Add(fs, flagvalue.Bool{P: &detail}, "detail", "with --json, list each deletion")
	addRunFlags(cmd, &cfg, replayShows)
	setEnvHelp(cmd, envAll)
	return cmd
}

// traceCmd is `gcagent trace`, whose one verb is export.
func (c *cli) traceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace <verb>",
		Short: "the node's usage trace, which replay reads (trace export)",
		Args:  unknownCommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return usagef("trace: want a verb: export") },
	}
	cmd.AddCommand(c.traceExportCmd())
	return cmd
}

// traceExportCmd is `gcagent trace export` (trace.ExportCommand).
func (c *cli) traceExportCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	var file string
	cmd := &cobra.Command{
		Use:   "export [flags]",
		Short: "write the node's usage trace as JSON lines (docs/replay.md)",
		Long: "Writes the node's usage trace as JSON lines (docs/replay.md): from the agent at\n" +
			"--metrics-address, else from the state file in --state-dir (read only).",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.settleRun(cmd, &cfg); err != nil {
				return err
			}
			return trace.ExportCommand(cmd.Context(), trace.ExportOptions{Source: traceSource(file, cfg, c.stdin),
				Node: cfg.NodeName, Cluster: cfg.Cluster}, c.stdout)
		},
	}
	cmd.Flags().StringVar(&file, "trace", "", "read the trace from this `file` instead (- for standard input)")
	addRunFlags(cmd, &cfg, []string{"config", "state-dir", "metrics-address", "node-name", "cluster"})
	setEnvHelp(cmd, envAll)
	return cmd
}
