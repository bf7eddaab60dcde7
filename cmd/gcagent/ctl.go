package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
)

// ctlQuiet is how long ctl --node all waits after the last reply on a
// fleet's NATS: nodes answer within milliseconds of each other.
const ctlQuiet = 500 * time.Millisecond

// ctl sends one control request over NATS to a node or to every node of
// the cluster and prints each reply, for a person or (--json) as one JSON
// line each. On the local agent's embedded server --node all expects its
// one reply; on a fleet's NATS it stops ctlQuiet after the last reply. It
// fails when no node answers or a reply is an error.
func ctl(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	cfg := agent.DefaultConfig()
	cfg.NATSURL = ""
	fs := newFlagSet("ctl")
	natsClientFlags(fs, &cfg)
	localStateDirFlag(fs, &cfg)
	node := fs.String("node", natsbus.AllNodes, "node to ask, or all")
	image := fs.String("image", "", "image name or digest (explain)")
	id := fs.String("id", "", "request id (default random)")
	timeout := 10 * time.Second
	fs.Var(durationValue{&timeout}, "timeout", "how long to wait for replies at most")
	asJSON := fs.Bool("json", false, "print each reply as one raw JSON line")
	h := help{Usage: "gcagent ctl [flags] " + strings.Join(natsbus.Verbs, "|"), Env: "shared",
		About: "Sends one control request over NATS to a node, or to every node of the cluster,\n" +
			"and prints the replies (--json: one raw JSON line each). Without --nats-url it asks\n" +
			"the local agent through its embedded NATS server, with the credentials in --state-dir."}
	target, err := parseNATSClient(fs, &cfg, args, env, h, stdout)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{fmt.Errorf("want one verb (%s)", strings.Join(natsbus.Verbs, ", "))}
	}
	verb := fs.Arg(0)
	o := natsbus.RequestOptions{ID: *id}
	if verb == natsbus.VerbExplain {
		if *image == "" {
			return usageError{errors.New("explain needs --image")}
		}
		o.Args = natsbus.ExplainArgs{Image: *image}
	}
	nc, err := connectTool(cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var replies []natsbus.ControlReply
	if *node == natsbus.AllNodes {
		want := 0
		if target.local {
			want = 1 // one embedded server, one agent
		} else {
			o.Quiet = ctlQuiet
		}
		replies, err = natsbus.RequestAll(ctx, nc, cfg.Cluster, verb, want, o)
	} else {
		var r natsbus.ControlReply
		r, err = natsbus.Request(ctx, nc, cfg.Cluster, *node, verb, o)
		replies = append(replies, r)
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		who := "no agent of cluster " + cfg.Cluster
		if *node != natsbus.AllNodes {
			who = "no agent " + *node + " of cluster " + cfg.Cluster
		}
		return fmt.Errorf("%s answers on %s (nobody subscribes to its control subject)%s", who, target.url, target.hint())
	case err != nil:
		return err
	case len(replies) == 0:
		return fmt.Errorf("no node of cluster %s answered on %s within %s", cfg.Cluster, target.url, timeout)
	}
	failed := 0
	enc := json.NewEncoder(stdout)
	for _, r := range replies {
		if !r.OK {
			failed++
		}
		if *asJSON {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	}
	if !*asJSON {
		printReplies(stdout, verb, replies)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d replies are errors", failed, len(replies))
	}
	return nil
}
