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
	"keep-image", "sandbox-image", "state-dir", "metrics-address",
	// --keep-list-nats reads the fleet keep list with these.
	"nats-url", "cluster", "nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-token",
	"nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-js-domain"}

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
	var file, sweep, order, keepFile string
	var asJSON, detail, keepNATS bool
	cost := replay.DefaultPullCost()
	cmd := &cobra.Command{
		Use:   "replay [flags]",
		Short: "what an image GC policy would have done over the node's usage trace",
		Long: "Simulates image GC over the node's usage trace and prints what the policy would\n" +
			"have deleted and re-pulled, how long the disk stayed above the high threshold and\n" +
			"how full it got, next to what really happened. The trace is --trace FILE (JSON\n" +
			"lines, as trace export writes; - for standard input), else the agent's at\n" +
			"--metrics-address, else the state file in --state-dir. Of run's flags, those\n" +
			"given change the policy the trace recorded; the others follow it. With a keep\n" +
			"list (--keep-list FILE, --keep-list-nats: the fleet's, read with run's NATS\n" +
			"flags), it prints the replay with that list beside the same replay without one:\n" +
			"the re-pulls it saves and the headroom it costs.\n\n" +
			"  gcagent replay --minimum-image-ttl-duration=1h\n" +
			"  gcagent replay --sweep image-gc-high-threshold=70..95:5\n" +
			"  gcagent replay --keep-list-nats --nats-url nats://nats:4222 --cluster prod",
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
				Order:    order, Sweep: sweep, JSON: asJSON, Detail: detail, PullCost: cost,
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			if keepFile != "" || keepNATS {
				k, err := c.replayKeepList(cmd, &cfg, keepFile, keepNATS)
				if err != nil {
					return err
				}
				o.KeepList = &k
				if err := o.Validate(); err != nil {
					return usageError{err}
				}
			}
			return replay.Command(cmd.Context(), o, c.stdout, c.stderr)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&file, "trace", "", "the trace `file` to replay (JSON lines, as trace export writes; - for standard input)")
	fs.StringVar(&sweep, "sweep", "", "replay once per value of one flag, `FLAG=A..B[:STEP]` (image-gc-high-threshold, image-gc-low-threshold: percents, step 1; minimum-image-ttl-duration, image-maximum-gc-age: durations, step needed), and print the frontier of re-pulls against free space")
	fs.StringVar(&order, "order", "lru", "deletion order of threshold GC: lru (the kubelet's and the agent's), gdsf (Greedy-Dual-Size-Frequency, a re-pull priced in pull time) or gdsf-bytes (priced in bytes), for comparison: the agent deletes by lru")
	fs.StringVar(&keepFile, "keep-list", "", "replay with the keep list in this `file` (patterns one a line, # comments; or what ctl keep ls --json prints) beside the same replay without one")
	flagvalue.Add(fs, flagvalue.Bool{P: &keepNATS}, "keep-list-nats", "replay with the fleet keep list read from NATS (--nats-url, --cluster: the all-clusters key, the cluster's and the cluster keep list) beside the same replay without one")
	flagvalue.Add(fs, flagvalue.Duration{P: &cost.Fixed}, "pull-fixed-cost", "time a pull takes whatever its size (resolving, round trips, unpacking), for re-pull time and gdsf")
	flagvalue.Add(fs, flagvalue.Bytes{P: &cost.Throughput}, "pull-throughput", "bytes per second a pull fetches beyond its fixed cost (the trace cannot measure it)")
	flagvalue.Add(fs, flagvalue.Strings{P: &cost.Near}, "pull-near", "images a peer or mirror holds, whose pull costs the fixed part only: a registry host glob (mirror.internal:5000, *.internal) or a keep `pattern` (with a /; repeatable)")
	flagvalue.Add(fs, flagvalue.Bool{P: &asJSON}, "json", "print the result as JSON")
	flagvalue.Add(fs, flagvalue.Bool{P: &detail}, "detail", "with --json, list each deletion")
	addRunFlags(cmd, &cfg, replayShows)
	fs.Lookup("nats-url").Usage = "NATS server URLs --keep-list-nats reads, comma separated (empty: the local agent's embedded server, found through --state-dir)"
	fs.Lookup("cluster").Usage = "cluster whose keep lists --keep-list-nats reads (and --keep-list, from ctl keep ls --json)"
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
