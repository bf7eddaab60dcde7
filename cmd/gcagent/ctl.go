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
)

// ctl sends one control request over NATS to a node or to every node of
// the cluster and prints each reply as one JSON line. It fails when no node
// answers or a reply is an error.
func ctl(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	cfg := agent.DefaultConfig()
	cfg.NATSURL = ""
	fs := newFlagSet("ctl")
	natsClientFlags(fs, &cfg)
	localStateDirFlag(fs, &cfg)
	node := fs.String("node", natsbus.AllNodes, "node to ask, or all")
	image := fs.String("image", "", "image name or digest (explain)")
	id := fs.String("id", "", "request id (default random)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for replies")
	h := help{Usage: "gcagent ctl [flags] " + strings.Join(natsbus.Verbs, "|"), Env: "shared",
		About: "Sends one control request over NATS to a node, or to every node of the cluster,\n" +
			"and prints the replies. Without --nats-url it asks the local agent through its\n" +
			"embedded NATS server, with the credentials in --state-dir."}
	if err := parseNATSClient(fs, &cfg, args, env, h, stdout); err != nil {
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
	nc, err := natsbus.Connect(cfg.ConnOptions())
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var replies []natsbus.ControlReply
	if *node == natsbus.AllNodes {
		replies, err = natsbus.RequestAll(ctx, nc, cfg.Cluster, verb, 0, o)
	} else {
		var r natsbus.ControlReply
		r, err = natsbus.Request(ctx, nc, cfg.Cluster, *node, verb, o)
		replies = append(replies, r)
	}
	if err != nil {
		return err
	}
	if len(replies) == 0 {
		return fmt.Errorf("no node of cluster %s answered within %s", cfg.Cluster, *timeout)
	}
	failed := 0
	enc := json.NewEncoder(stdout)
	for _, r := range replies {
		if !r.OK {
			failed++
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d replies are errors", failed, len(replies))
	}
	return nil
}
