package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkWatchStart: the time from `gcagent watch` starting (in process)
// to its first full table, against one server whose status stream holds
// the last values of 10,000 nodes (each put 3 times) and whose event
// stream holds the last minute's 30,000 heartbeats, with nothing else to
// do: the viewer's own cost, without a fleet's load on the servers (for
// that, BenchmarkFleetCluster in ./natsbus/).
func BenchmarkWatchStart(b *testing.B) {
	const nodes = 10_000
	s := startTestNATS(b)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, natsbus.StatusStreamConfig(natsbus.DefaultStatusStream, 1, time.Hour, 1<<30)); err != nil {
		b.Fatal(err)
	}
	for round := range 3 {
		for i := range nodes {
			st := schema.NodeStatus{Cluster: fmt.Sprint("c", i%10), Node: fmt.Sprintf("node-%05d", i), Version: "v1", At: time.Now().UTC(),
				HeartbeatIntervalSeconds: 30, ImageGCHighThreshold: 85, ImageGCLowThreshold: 80,
				Heartbeat: schema.Heartbeat{DiskUsagePercent: 40 + i%50, Images: 40 + round, Synced: true, ReclaimableBytes: 1 << 30, NATSMode: "jetstream",
					LastGC: &schema.LastGC{Kind: "image", At: time.Now().UTC(), Trigger: "disk", Removed: 7, FreedBytes: 3 << 30}}}
			data, _ := json.Marshal(st)
			if _, err := js.PublishAsync(natsbus.StatusSubject(st.Cluster, st.Node), data); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
	}
	// The last minute of a busy fleet's events: heartbeats and a GC wave,
	// which watch tails from --since 1m (its default).
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsbus.DefaultStream, Subjects: []string{natsbus.EventPrefix + ".>"}}); err != nil {
		b.Fatal(err)
	}
	for i := range 3 * nodes {
		node, cluster := fmt.Sprintf("node-%05d", i%nodes), fmt.Sprint("c", i%nodes%10)
		ev, _ := natsbus.NewEvent(cluster, node, natsbus.Action{Kind: "agent", Action: "heartbeat", Subject: node, Key: fmt.Sprint(i),
			Data: schema.Heartbeat{DiskUsagePercent: 50, Images: 40, NATSMode: "jetstream"}}, time.Now())
		data, _ := json.Marshal(ev)
		if _, err := js.PublishAsync(natsbus.Subject(cluster, node, "agent", "heartbeat"), data); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut syncBuffer
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			done <- execute(ctx, []string{"watch", "--nats-url", s.ClientURL(), "--cluster", "*", "--refresh", "1h"}, nil, &out, &errOut)
		}()
		want := fmt.Sprintf("nodes: %d", nodes)
		for !strings.Contains(out.String(), want) {
			if time.Since(start) > time.Minute {
				b.Fatalf("no full table after a minute: %s %s", out.String(), errOut.String())
			}
			time.Sleep(time.Millisecond)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s-to-table")
		cancel()
		<-done
	}
}
