package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/internal/suggest"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// ctlQuiet is how long ctl --node all waits after the last reply on a
// fleet's NATS: nodes answer within milliseconds of each other.
const ctlQuiet = 500 * time.Millisecond

// ctlCmd is `gcagent ctl VERB`: one control request over NATS; `gcagent
// ctl keep` is its subcommand. The verb is an argument, so that flags go
// before or after it.
func (c *cli) ctlCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	o := ctlOptions{node: natsbus.AllNodes, timeout: 10 * time.Second}
	cmd := &cobra.Command{
		Use:   "ctl [flags] " + strings.Join(natsbus.Verbs, "|"),
		Short: "send a control request over NATS (" + strings.Join(natsbus.Verbs, ", ") + "); ctl keep: the fleet keep list",
		Long: "Sends one control request over NATS to a node, or to every node of the cluster,\n" +
			"and prints the replies (--json: one raw JSON line each). Without --nats-url it asks\n" +
			"the local agent through its embedded NATS server, with the credentials in --state-dir.\n\n" +
			"  status   the node's projection summary, disk and outbox\n" +
			"  plan     what a GC pass would delete now\n" +
			"  explain  why an image (--image) is kept or would go\n" +
			"  gc       run an image GC pass now (only on an agent run with --allow-remote-gc)",
		ValidArgs: natsbus.Verbs,
		Args:      ctlVerb,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.ctl(cmd, &cfg, o, args[0])
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.node, "node", o.node, "`node` to ask, or all")
	fs.StringVar(&o.image, "image", "", "image name or digest (explain)")
	fs.StringVar(&o.id, "id", "", "request id (default random)")
	flagvalue.Add(fs, flagvalue.Duration{P: &o.timeout}, "timeout", "how long to wait for replies at most")
	flagvalue.Add(fs, flagvalue.Bool{P: &o.json}, "json", "print each reply as one raw JSON line")
	addNATSClientFlags(cmd, &cfg)
	setEnvHelp(cmd, envShared)
	cmd.AddCommand(c.keepCmd())
	return cmd
}

// ctlOptions are the flags of ctl of its own.
type ctlOptions struct {
	node, image, id string
	timeout         time.Duration
	json            bool
}

// ctlVerb wants one verb, and refuses an unknown one here rather than
// sending it to the nodes.
func ctlVerb(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usagef("%swant a verb (%s) or keep", where(cmd), strings.Join(natsbus.Verbs, ", "))
	}
	if !slices.Contains(natsbus.Verbs, args[0]) {
		hint := suggest.DidYouMean(args[0], append(slices.Clone(natsbus.Verbs), "keep"))
		if hint == "" {
			hint = " (want " + strings.Join(natsbus.Verbs, ", ") + " or keep)"
		}
		return usagef("%sunknown verb %q%s", where(cmd), args[0], hint)
	}
	if len(args) > 1 {
		return usagef("%sunexpected argument %q after the verb", where(cmd), args[1])
	}
	return nil
}

// ctl sends one control request over NATS to a node or to every node of
// the cluster and prints each reply, for a person or (--json) as one JSON
// line each. On the local agent's embedded server --node all expects its
// one reply; on a fleet's NATS it stops ctlQuiet after the last reply. It
// fails when no node answers or a reply is an error.
func (c *cli) ctl(cmd *cobra.Command, cfg *agent.Config, o ctlOptions, verb string) error {
	ctx, stdout := cmd.Context(), c.stdout
	target, err := c.natsTool(cmd, cfg)
	if err != nil {
		return err
	}
	req := natsbus.RequestOptions{ID: o.id}
	if verb == natsbus.VerbExplain {
		if o.image == "" {
			return usagef("%sexplain needs --image", where(cmd))
		}
		req.Args = natsbus.ExplainArgs{Image: o.image}
	}
	nc, err := connectTool(*cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var replies []natsbus.ControlReply
	if o.node == natsbus.AllNodes {
		want := 0
		if target.local {
			want = 1 // one embedded server, one agent
		} else {
			req.Quiet = ctlQuiet
		}
		replies, err = natsbus.RequestAll(ctx, nc, cfg.Cluster, verb, want, req)
	} else {
		var r natsbus.ControlReply
		r, err = natsbus.Request(ctx, nc, cfg.Cluster, o.node, verb, req)
		replies = append(replies, r)
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		who := "no agent of cluster " + cfg.Cluster
		if o.node != natsbus.AllNodes {
			who = "no agent " + o.node + " of cluster " + cfg.Cluster
		}
		return fmt.Errorf("%s answers on %s (nobody subscribes to its control subject)%s", who, target.url, target.hint())
	case err != nil:
		return err
	case len(replies) == 0:
		return fmt.Errorf("no node of cluster %s answered on %s within %s", cfg.Cluster, target.url, o.timeout)
	}
	failed := 0
	enc := json.NewEncoder(stdout)
	for _, r := range replies {
		if !r.OK {
			failed++
		}
		if o.json {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	}
	if !o.json {
		printReplies(stdout, verb, replies)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d replies are errors", failed, len(replies))
	}
	return nil
}
