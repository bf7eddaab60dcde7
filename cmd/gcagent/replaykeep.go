package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/replay"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// replayKeepTimeout bounds reading the fleet keep list from NATS.
const replayKeepTimeout = 30 * time.Second

// replayKeepList reads the keep list replay compares: the file (a usage
// error when it cannot be read or holds a bad pattern), the fleet's from
// NATS, or both, merged.
func (c *cli) replayKeepList(cmd *cobra.Command, cfg *agent.Config, file string, fromNATS bool) (replay.KeepList, error) {
	var k replay.KeepList
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return k, usagef("--keep-list: %v", err)
		}
		fk, err := replay.ParseKeepList(file, b, natsbus.SafeToken(cfg.Cluster))
		if err != nil {
			return k, usagef("--keep-list: %v", err)
		}
		k.Add(fk)
	}
	if fromNATS {
		nk, err := c.fleetKeepList(cmd, cfg)
		if err != nil {
			return k, err
		}
		k.Add(nk)
	}
	return k, nil
}

// fleetKeepList reads the fleet keep list an agent of cfg.Cluster merges:
// the all-clusters key, the cluster's key, and the cluster keep list
// gcagent-cluster writes. A pattern the agent would take as invalid is
// an error: the agent keeps every name that starts with its literal
// text, which the replay does not imitate.
func (c *cli) fleetKeepList(cmd *cobra.Command, cfg *agent.Config) (replay.KeepList, error) {
	var k replay.KeepList
	target, err := c.natsTool(cmd, cfg)
	if err != nil {
		return k, err
	}
	nc, err := connectTool(*cfg, target)
	if err != nil {
		return k, err
	}
	defer nc.Close()
	js, err := natsbus.NewJetStream(nc, cfg.NATSJSDomain)
	if err != nil {
		return k, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), replayKeepTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, natsbus.KeepBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return k, fmt.Errorf("no fleet keep list on %s (no bucket %s): nothing to compare", target.url, natsbus.KeepBucket)
	}
	if err != nil {
		return k, fmt.Errorf("the fleet keep list on %s: %w", target.url, err)
	}
	lists, err := natsbus.ReadKeep(ctx, kv)
	if err != nil {
		return k, fmt.Errorf("the fleet keep list on %s: %w", target.url, err)
	}
	for _, key := range []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cfg.Cluster)} {
		l, ok := lists[key]
		if !ok {
			continue
		}
		for _, p := range l.Patterns {
			if err := gc.ValidKeepPattern(p); err != nil {
				return k, fmt.Errorf("the fleet keep list on %s: key %s: %v: the agent keeps every image whose name starts with its text before the first glob character, which replay does not imitate; fix it (gcagent ctl keep rm) or give the list as a file (--keep-list)", target.url, key, err)
			}
		}
		k.Add(replay.KeepList{Patterns: l.Patterns, Sources: []string{fmt.Sprintf("NATS %s key %s (%d patterns)", target.url, key, len(l.Patterns))}})
	}
	cl, err := natsbus.ReadCluster(ctx, kv, cfg.Cluster)
	if err != nil {
		return k, fmt.Errorf("the cluster keep list of %s on %s: %w", cfg.Cluster, target.url, err)
	}
	if cl == nil {
		k.Notes = append(k.Notes, fmt.Sprintf("no cluster keep list for cluster %s on %s (gcagent-cluster writes it)", cfg.Cluster, target.url))
	} else {
		ck := replay.ClusterKeepList(cl)
		ck.Sources = []string{fmt.Sprintf("NATS %s cluster keep list of %s (%s, %d references)", target.url, cfg.Cluster, cl.Head.State, len(ck.Declared))}
		k.Add(ck)
	}
	if k.Len() == 0 {
		return k, fmt.Errorf("the fleet keep list of cluster %s on %s holds no pattern: nothing to compare", cfg.Cluster, target.url)
	}
	return k, nil
}
