package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gcagent/gcagent/replay"
	"github.com/gcagent/gcagent/trace"
)

// replayHelp and traceExportHelp are the help of `gcagent replay` and
// `gcagent trace export`.
var (
	replayHelp = help{Usage: "gcagent replay [--trace FILE] [--sweep FLAG=A..B[:STEP]] [--order lru|gdsf] [--json [--detail]] [run's flags]", Env: "all",
		About: "Simulates image GC over the node's usage trace and prints what the policy would\n" +
			"have deleted and re-pulled, how long the disk stayed above the high threshold and\n" +
			"how full it got, next to what really happened. The trace is --trace FILE (JSON\n" +
			"lines, as trace export writes; - for standard input), else the agent's at\n" +
			"--metrics-address, else the state file in --state-dir. It takes run's flags:\n" +
			"those given change the policy the trace recorded, the others follow it.\n\n" +
			"  --trace FILE                  the trace to replay\n" +
			"  --sweep FLAG=A..B[:STEP]      replay once per value of image-gc-high-threshold,\n" +
			"                                image-gc-low-threshold (percents, step 1) or\n" +
			"                                minimum-image-ttl-duration, image-maximum-gc-age\n" +
			"                                (durations, step needed), and print the frontier of\n" +
			"                                re-pulls against free space; sweeping the high\n" +
			"                                threshold moves the low one along unless given\n" +
			"  --order lru|gdsf              deletion order of threshold GC (default lru)\n" +
			"  --json                        the result as JSON; --detail lists each deletion\n"}
	traceExportHelp = help{Usage: "gcagent trace export [--trace FILE] [run's flags]", Env: "all",
		About: "Writes the node's usage trace as JSON lines (docs/replay.md): from the agent at\n" +
			"--metrics-address, else from the state file in --state-dir (read only)."}
)

// ownFlags takes the named flags (--name VALUE, --name=VALUE; bools
// without a value) out of args, so that the rest parses with run's flag
// set.
func ownFlags(args []string, names map[string]bool) (rest []string, vals map[string]string, err error) {
	vals = map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), vals, nil
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		isBool, ok := names[name]
		if !strings.HasPrefix(a, "-") || !ok {
			rest = append(rest, a)
			continue
		}
		switch {
		case hasVal:
		case isBool:
			val = "true"
		case i+1 < len(args):
			i++
			val = args[i]
		default:
			return nil, nil, fmt.Errorf("flag needs an argument: --%s", name)
		}
		vals[name] = val
	}
	return rest, vals, nil
}

// replayCmd runs `gcagent replay` (replay.Command).
func replayCmd(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	rest, own, err := ownFlags(args, map[string]bool{"trace": false, "sweep": false, "order": false, "json": true, "detail": true})
	if err != nil {
		return usageError{err}
	}
	cfg, err := parseRun(rest, env, replayHelp, stdout)
	if err != nil {
		return err
	}
	asJSON, detail := false, false
	for name, p := range map[string]*bool{"json": &asJSON, "detail": &detail} {
		if v, ok := own[name]; ok {
			if *p, err = strconv.ParseBool(v); err != nil {
				return usageError{fmt.Errorf("invalid --%s %q: %v", name, v, err)}
			}
		}
	}
	given := func(flag string) bool { return cfg.Sources[flag] != "" }
	o := replay.CommandOptions{
		Source:   trace.Source{File: own["trace"], Stdin: nil, Agent: cfg.MetricsAddress, StateDir: cfg.StateDir},
		Policy:   replay.Given(cfg.ImagePolicy(), given),
		LowGiven: given(replay.FlagLow),
		Order:    own["order"], Sweep: own["sweep"], JSON: asJSON, Detail: detail,
	}
	if o.Source.File == "-" {
		o.Source.Stdin = stdinReader
	}
	if err := o.Validate(); err != nil {
		return usageError{err}
	}
	return replay.Command(ctx, o, stdout, stderr)
}

// traceCmd runs `gcagent trace export` (trace.ExportCommand).
func traceCmd(ctx context.Context, args []string, env func(string) string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "export" {
		return usageError{fmt.Errorf("trace: want a verb: export")}
	}
	rest, own, err := ownFlags(args[1:], map[string]bool{"trace": false})
	if err != nil {
		return usageError{err}
	}
	cfg, err := parseRun(rest, env, traceExportHelp, stdout)
	if err != nil {
		return err
	}
	src := trace.Source{File: own["trace"], Agent: cfg.MetricsAddress, StateDir: cfg.StateDir}
	if src.File == "-" {
		src.Stdin = stdinReader
	}
	return trace.ExportCommand(ctx, trace.ExportOptions{Source: src, Node: cfg.NodeName, Cluster: cfg.Cluster}, stdout)
}
