package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
)

var keepHelp = help{Usage: "gcagent ctl keep add|rm PATTERN [--cluster NAME | --all-clusters] [flags]\n       gcagent ctl keep ls [flags]",
	Env: "shared",
	About: "Changes the fleet keep list: image name globs (as --keep-image, path.Match; REPO or\n" +
		"REPO:* also covers REPO's digest-pinned images, REPO@sha256:..., another tag glob does not) that\n" +
		"image GC keeps on every node of a cluster (--cluster) or of all clusters\n" +
		"(--all-clusters), without a restart. The list is stored once in the NATS key-value\n" +
		"bucket " + natsbus.KeepBucket + " (add creates it, with --replicas, when missing); every agent\n" +
		"watches its cluster's key and the all-clusters key and applies a change within\n" +
		"seconds. Writing needs credentials allowed to write the bucket. ls prints every list."}

// ctlKeep runs `gcagent ctl keep add|rm|ls`.
func ctlKeep(ctx context.Context, args []string, env func(string) string, stdout io.Writer) error {
	cfg := agent.DefaultConfig()
	cfg.NATSURL = ""
	fs := newFlagSet("keep")
	natsClientFlags(fs, &cfg)
	localStateDirFlag(fs, &cfg)
	all := fs.Bool("all-clusters", false, "change the list of every cluster instead of --cluster's")
	replicas := fs.Int("replicas", 1, "replicas of the bucket when add creates it (3 on a clustered JetStream)")
	timeout := 10 * time.Second
	fs.Var(durationValue{&timeout}, "timeout", "how long to wait for NATS at most")
	asJSON := fs.Bool("json", false, "ls: print the lists as JSON")
	target, err := parseNATSClient(fs, &cfg, flagsFirst(fs, args), env, keepHelp, stdout)
	if err != nil {
		return err
	}
	verb, pattern := fs.Arg(0), fs.Arg(1)
	switch {
	case verb == "ls" && fs.NArg() == 1:
	case (verb == "add" || verb == "rm") && fs.NArg() == 2:
		if strings.TrimSpace(pattern) == "" {
			return usageError{errors.New("keep: the pattern must not be empty")}
		}
		if err := gc.ValidKeepPattern(pattern); err != nil {
			return usageError{fmt.Errorf("keep: invalid pattern: %v", err)}
		}
	default:
		return usageError{errors.New("keep: want add PATTERN, rm PATTERN or ls")}
	}
	if *replicas < 1 || *replicas > 5 {
		return usageError{fmt.Errorf("keep: invalid --replicas %d: must be 1 to 5", *replicas)}
	}
	key, scope := natsbus.KeepClusterKey(cfg.Cluster), "cluster "+cfg.Cluster
	if *all {
		key, scope = natsbus.KeepAllKey, "all clusters"
	}
	nc, err := connectTool(cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsbus.NewJetStream(nc, cfg.NATSJSDomain)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var kv jetstream.KeyValue
	if verb == "add" {
		kv, err = natsbus.EnsureKeepBucket(ctx, js, *replicas, 0)
	} else if kv, err = js.KeyValue(ctx, natsbus.KeepBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		if verb == "ls" {
			fmt.Fprintf(stdout, "no fleet keep list on %s (no bucket %s)\n", target.url, natsbus.KeepBucket)
			return nil
		}
		return fmt.Errorf("%s is not in the keep list of %s: there is no bucket %s on %s", pattern, scope, natsbus.KeepBucket, target.url)
	}
	if err != nil {
		return err
	}
	switch verb {
	case "ls":
		lists, err := natsbus.ReadKeep(ctx, kv)
		if err != nil {
			return err
		}
		return printKeep(stdout, lists, *asJSON)
	case "add":
		l, err := natsbus.EditKeep(ctx, kv, key, cfg.NodeName, time.Now, func(p []string) ([]string, error) {
			if !slices.Contains(p, pattern) {
				p = append(p, pattern)
			}
			slices.Sort(p)
			return p, nil
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "kept %s on %s (revision %d, %d patterns); agents apply it within seconds\n", pattern, scope, l.Revision, len(l.Patterns))
		fmt.Fprintf(stdout, "%s covers %s\n", pattern, gc.DescribeKeepPattern(pattern))
	case "rm":
		l, err := natsbus.EditKeep(ctx, kv, key, cfg.NodeName, time.Now, func(p []string) ([]string, error) {
			i := slices.Index(p, pattern)
			if i < 0 {
				return nil, fmt.Errorf("%s is not in the keep list of %s (%s)", pattern, scope, strings.Join(p, ", "))
			}
			return slices.Delete(p, i, i+1), nil
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s from %s (revision %d, %d patterns left)\n", pattern, scope, l.Revision, len(l.Patterns))
	}
	return nil
}

// printKeep prints every list: one line per pattern with its scope.
func printKeep(w io.Writer, lists map[string]natsbus.KeepList, asJSON bool) error {
	if asJSON {
		byScope := map[string]natsbus.KeepList{}
		for k, l := range lists {
			byScope[natsbus.KeepKeyCluster(k)] = l
		}
		return json.NewEncoder(w).Encode(byScope)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tPATTERN\tUPDATED\tBY")
	n := 0
	for _, k := range slices.Sorted(maps.Keys(lists)) {
		l := lists[k]
		for _, p := range l.Patterns {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", natsbus.KeepKeyCluster(k), p, l.UpdatedAt.Format(time.RFC3339), l.UpdatedBy)
			n++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintln(w, "(the fleet keep list is empty)")
	}
	return nil
}

// flagsFirst moves the positional arguments after the flags, so that
// `keep add PATTERN --cluster prod` parses as the usage says (Go's flag
// package stops at the first argument that is not a flag). Arguments it
// cannot parse are returned as given, for parseFlags to report.
func flagsFirst(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return args
		}
		flags = append(flags, rest[:len(rest)-fs.NArg()]...)
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	return append(flags, pos...)
}
