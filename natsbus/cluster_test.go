package natsbus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startCluster starts n nats-servers on loopback routed into one cluster,
// each with JetStream in its own store, and waits until JetStream has a
// meta leader. They are shut down at the end of the test.
func startCluster(t *testing.T, n int) []*server.Server {
	t.Helper()
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		ports[i] = freePort(t)
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[i])
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		s, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("s%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "gcagent-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers[i] = s
	}
	for i, s := range servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("server %d not ready", i)
		}
	}
	nc := connect(t, servers[0].ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 20*time.Second, "a JetStream meta leader, all routes and every server a placement peer", func() bool {
		peers := 0
		for _, s := range servers {
			if s.NumRoutes() < n-1 {
				return false
			}
			// Only the meta leader answers: the servers whose JetStream it
			// has heard from. Fewer than n and an R3 stream cannot be
			// placed yet (err_code 10005, seen under load).
			peers = max(peers, len(s.JetStreamClusterPeers()))
		}
		if peers < n {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	return servers
}

// TestClusterR3ServerKilledDuringBurst: a Publisher writes a burst into an
// R3 stream on a three-server cluster; the server leading the stream, to
// which the Publisher is connected, is killed in the middle. Every event is
// stored exactly once: the outbox resends what lost its ack, the stream's
// replicated dedupe state drops what had been stored.
func TestClusterR3ServerKilledDuringBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	servers := startCluster(t, 3)
	admin := connect(t, servers[0].ClientURL())
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Create the stream first to learn its leader; the Publisher uses it as it is.
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: DefaultStream, Subjects: []string{EventPrefix + ".>"}, Replicas: 3, Duplicates: DefaultDuplicateWindow,
		MaxAge: DefaultStreamMaxAge, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	var leader *server.Server
	wait.Until(t, 10*time.Second, "a stream leader", func() bool {
		info, err := st.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		for _, s := range servers {
			if s.Name() == info.Cluster.Leader {
				leader = s
			}
		}
		return leader != nil
	})

	// The Publisher knows only the leader's URL; it learns the others from the cluster.
	nc := connect(t, leader.ClientURL())
	p := newPublisher(t, nc, t.TempDir(), PublisherOptions{Replicas: 3, AckTimeout: 2 * time.Second})
	sw, err := NewStatusWriter(nc, StatusOptions{Cluster: "c1", Node: "node-1", Replicas: 3, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Put(ctx, map[string]int{"seq": 1}); err != nil {
		t.Fatalf("status put: %v", err)
	}
	const n, killAt = 2000, 600
	want := make([]string, n)
	published := make(chan int, n)
	go func() {
		for i := range n {
			if err := p.Publish(action(i)); err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			want[i] = actionID(i)
			published <- i
		}
		close(published)
	}()
	for i := range published {
		if i == killAt {
			break
		}
	}
	stored := streamCount(admin)
	leader.Shutdown()
	leader.WaitForShutdown()
	t.Logf("killed stream leader %s after %d events published, %d stored", leader.Name(), killAt+1, stored)
	for range published {
	}
	var survivor *server.Server
	for _, s := range servers {
		if s != leader {
			survivor = s
			break
		}
	}
	check := connect(t, survivor.ClientURL())
	wait.Until(t, 25*time.Second, "every event acked", func() bool { return p.Depth() == 0 && streamCount(check) >= n })
	if nc.ConnectedServerName() == leader.Name() {
		t.Fatalf("publisher still on the killed server")
	}
	assertExactlyOnce(t, check, want)
	// The node's last value survives the kill and takes a new put. Each
	// try and what follows get a context of their own: the test's first
	// one (10 s) may have ended by now on a loaded machine.
	wait.For(t, 20*time.Second, func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sw.Put(ctx, map[string]int{"seq": 2}); err != nil {
			return err.Error()
		}
		return ""
	})
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cjs, _ := jetstream.New(check)
	sst, err := cjs.Stream(ctx, DefaultStatusStream)
	if err != nil {
		t.Fatal(err)
	}
	if r := sst.CachedInfo().Config.Replicas; r != 3 || sst.CachedInfo().Config.MaxMsgsPerSubject != 1 {
		t.Errorf("status stream: replicas %d, max msgs per subject %d", r, sst.CachedInfo().Config.MaxMsgsPerSubject)
	}
	// The status stream allows direct gets, which any replica answers: one
	// that has not applied the put yet answers the value before it.
	wait.For(t, 10*time.Second, func() string {
		m, err := sst.GetLastMsgForSubject(ctx, StatusSubject("c1", "node-1"))
		if err != nil {
			return "last status after the kill: " + err.Error()
		}
		if string(m.Data) != `{"seq":2}` {
			return "last status after the kill: " + string(m.Data)
		}
		return ""
	})
	t.Logf("republished %v, duplicates acked %v, reconnects %d",
		testutil.ToFloat64(p.m.republishes), testutil.ToFloat64(p.m.duplicates), nc.Stats().Reconnects)
	if !nc.IsConnected() || nc.Stats().Reconnects == 0 {
		t.Errorf("publisher did not fail over: connected %v, reconnects %d", nc.IsConnected(), nc.Stats().Reconnects)
	}
	info, err := jetstream.New(check)
	if err != nil {
		t.Fatal(err)
	}
	s, err := info.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config.Replicas; c != 3 {
		t.Errorf("stream replicas %d", c)
	}
}
