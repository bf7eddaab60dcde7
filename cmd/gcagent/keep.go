package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/internal/suggest"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// keepCmd is `gcagent ctl keep add|rm PATTERN` and `gcagent ctl keep ls`.
func (c *cli) keepCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	o := keepOptions{replicas: 1, timeout: 10 * time.Second}
	cmd := &cobra.Command{
		Use:   "keep add|rm PATTERN [flags]\ngcagent ctl keep ls [flags]",
		Short: "change or show the fleet keep list in NATS (add, rm, ls)",
		Long: "Changes the fleet keep list: image name globs (as --keep-image, path.Match) that\n" +
			"image GC keeps on every node of a cluster (--cluster) or of all clusters\n" +
			"(--all-clusters), without a restart. The list is stored once in the NATS key-value\n" +
			"bucket " + natsbus.KeepBucket + " (add creates it, with --replicas, when missing); every agent\n" +
			"watches its cluster's key and the all-clusters key and applies a change within\n" +
			"seconds. Writing needs credentials allowed to write the bucket. ls prints every list.\n" +
			"A pattern REPO or REPO:* also keeps REPO's digest-pinned images (REPO@sha256:...);\n" +
			"another tag glob (REPO:1.*) does not: a digest reference has no tag. add says what\n" +
			"the pattern covers.",
		ValidArgs: []string{"add", "rm", "ls"},
		Args:      keepArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.keep(cmd, &cfg, o, args)
		},
	}
	fs := cmd.Flags()
	flagvalue.Add(fs, flagvalue.Bool{P: &o.all}, "all-clusters", "change the list of every cluster instead of --cluster's")
	flagvalue.Add(fs, flagvalue.Int{P: &o.replicas, Hint: "1 to 5"}, "replicas", "replicas of the bucket when add creates it (3 on a clustered JetStream)")
	flagvalue.Add(fs, flagvalue.Duration{P: &o.timeout}, "timeout", "how long to wait for NATS at most")
	flagvalue.Add(fs, flagvalue.Bool{P: &o.json}, "json", "ls: print the lists as JSON")
	addNATSClientFlags(cmd, &cfg)
	setEnvHelp(cmd, envShared)
	return cmd
}

// keepOptions are the flags of ctl keep of its own.
type keepOptions struct {
	all, json bool
	replicas  int
	timeout   time.Duration
}

// keepArgs wants add PATTERN, rm PATTERN or ls.
func keepArgs(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 1 && args[0] == "ls":
	case len(args) == 2 && (args[0] == "add" || args[0] == "rm"):
		if strings.TrimSpace(args[1]) == "" {
			return usagef("%sthe pattern must not be empty", where(cmd))
		}
		if err := gc.ValidKeepPattern(args[1]); err != nil {
			return usagef("%sinvalid pattern: %v", where(cmd), err)
		}
	case len(args) > 0 && !slices.Contains([]string{"add", "rm", "ls"}, args[0]):
		hint := suggest.DidYouMean(args[0], []string{"add", "rm", "ls"})
		if hint == "" {
			hint = " (want add PATTERN, rm PATTERN or ls)"
		}
		return usagef("%sunknown verb %q%s", where(cmd), args[0], hint)
	default:
		return usagef("%swant add PATTERN, rm PATTERN or ls", where(cmd))
	}
	return nil
}

// keep runs `gcagent ctl keep add|rm|ls`.
func (c *cli) keep(cmd *cobra.Command, cfg *agent.Config, o keepOptions, args []string) error {
	ctx, stdout := cmd.Context(), c.stdout
	verb, pattern := args[0], ""
	if len(args) > 1 {
		pattern = args[1]
	}
	if o.replicas < 1 || o.replicas > 5 {
		return usagef("%sinvalid --replicas %d: must be 1 to 5", where(cmd), o.replicas)
	}
	target, err := c.natsTool(cmd, cfg)
	if err != nil {
		return err
	}
	key, scope := natsbus.KeepClusterKey(cfg.Cluster), "cluster "+cfg.Cluster
	if o.all {
		key, scope = natsbus.KeepAllKey, "all clusters"
	}
	nc, err := connectTool(*cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsbus.NewJetStream(nc, cfg.NATSJSDomain)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var kv jetstream.KeyValue
	if verb == "add" {
		kv, err = natsbus.EnsureKeepBucket(ctx, js, o.replicas, 0)
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
		cl, err := natsbus.ReadCluster(ctx, kv, cfg.Cluster)
		if err != nil {
			return fmt.Errorf("the cluster keep list of %s: %w", cfg.Cluster, err)
		}
		return printKeep(stdout, lists, cl, o.json)
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

// printKeep prints every list: one line per pattern with its scope, then
// the cluster keep list (gcagent-cluster's, nil: none), one line per
// image with the workloads that declare it.
func printKeep(w io.Writer, lists map[string]natsbus.KeepList, cl *declared.List, asJSON bool) error {
	if asJSON {
		byScope := map[string]any{}
		for k, l := range lists {
			byScope[natsbus.KeepKeyCluster(k)] = l
		}
		if cl != nil {
			byScope["declared"] = map[string]any{"head": cl.Head, "missingShards": cl.Missing, "images": cl.Images}
		}
		return json.NewEncoder(w).Encode(byScope)
	}
	if err := printPatterns(w, lists); err != nil {
		return err
	}
	if cl == nil {
		return nil
	}
	h := cl.Head
	fmt.Fprintf(w, "\ncluster keep list (gcagent-cluster %s): %s, %d images from %d workloads, heartbeat %s",
		h.By, h.State, len(cl.Images), h.Workloads, h.Heartbeat.Format(time.RFC3339))
	if h.Reason != "" {
		fmt.Fprintf(w, " (%s)", h.Reason)
	}
	if cl.Missing > 0 {
		fmt.Fprintf(w, "; %d shards missing", cl.Missing)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDECLARED BY")
	for _, im := range cl.Images {
		fmt.Fprintf(tw, "%s\t%s\n", im.Ref, cl.Sources(im.Ref))
	}
	return tw.Flush()
}

// printPatterns prints the operator's lists: one line per pattern with
// its scope.
func printPatterns(w io.Writer, lists map[string]natsbus.KeepList) error {
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
