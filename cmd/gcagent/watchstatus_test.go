package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

// putStatuses puts each node's status several times (only the last must
// count) through a StatusWriter, as agents do with every heartbeat.
func putStatuses(t *testing.T, url string, at time.Time, sts ...schema.NodeStatus) {
	t.Helper()
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: url, Node: "putter", FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, st := range sts {
		w, err := natsbus.NewStatusWriter(nc, natsbus.StatusOptions{Cluster: st.Cluster, Node: st.Node})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			v := st
			v.At = at.Add(time.Duration(i-2) * time.Second)
			if i < 2 {
				v.DiskUsagePercent = 1 // older values: not what watch must show
			}
			if err := w.Put(context.Background(), v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWatchStartsFromLastValues: watch shows every node from its last
// value at once (no event replayed), the nodes that need a look first
// with why, filters by --node, and --json says when all are loaded.
func TestWatchStartsFromLastValues(t *testing.T) {
	s := startTestNATS(t)
	now := time.Now().UTC()
	st := func(cluster, node string, disk, outbox int) schema.NodeStatus {
		return schema.NodeStatus{Cluster: cluster, Node: node, Version: "v9", HeartbeatIntervalSeconds: 30,
			ImageGCHighThreshold: 85, ImageGCLowThreshold: 80,
			Heartbeat: schema.Heartbeat{DiskUsagePercent: disk, Images: 7, Synced: true, ReclaimableBytes: 1 << 20,
				Outbox: outbox, NATSMode: natsbus.ModeJetStream}}
	}
	full := st("c1", "n-full", 93, 0)
	full.ReclaimableBytes = 0
	putStatuses(t, s.ClientURL(), now, full, st("c1", "n-ok", 40, 0), st("c1", "n-over", 88, 0), st("c2", "x-other", 99, 0))

	run := func(args ...string) string {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut syncBuffer
		done := make(chan error, 1)
		go func() {
			done <- execute(ctx, append([]string{"watch", "--nats-url", s.ClientURL(), "--refresh", "1h"}, args...), nil, &out, &errOut)
		}()
		wait.For(t, 10*time.Second, func() string {
			if !strings.Contains(out.String(), "nodes: ") && !strings.Contains(out.String(), `"loaded"`) {
				return "no table yet: " + out.String() + errOut.String()
			}
			return ""
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("watch: %v (%s)", err, errOut.String())
		}
		return out.String()
	}
	// --refresh 1h: what shows was drawn when the last values were in.
	table := run("--cluster", "c1")
	for _, want := range []string{"nodes: 3", "unrelievable 1", "over-high 1", "NEEDS A LOOK (2 nodes", "93%", "40%"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Index(table, "n-full") > strings.Index(table, "n-over") || strings.Contains(table, "x-other") || strings.Contains(table, " 1%") {
		t.Errorf("worst first, cluster c1 only, last values only:\n%s", table)
	}

	lines := run("--cluster", "*", "--node", "n-*", "--json")
	var loaded struct {
		Loaded struct{ Nodes int } `json:"loaded"`
	}
	statuses := 0
	for _, l := range strings.Split(strings.TrimSpace(lines), "\n") {
		switch {
		case strings.HasPrefix(l, `{"status":`):
			statuses++
		case strings.HasPrefix(l, `{"loaded":`):
			if err := json.Unmarshal([]byte(l), &loaded); err != nil {
				t.Fatal(err)
			}
		}
	}
	if statuses != 3 || loaded.Loaded.Nodes != 3 {
		t.Errorf("--node n-* --json: %d statuses, loaded %+v, want 3:\n%s", statuses, loaded, lines)
	}
}
