package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeafNodeAgentExactlyOnce: the agent binary, on a private containerd,
// connects to a site's leaf server that extends the hub's JetStream domain
// (--nats-js-domain hub). The leaf's link to the hub is cut while the agent
// removes dead containers (and heartbeats every second), then restored:
// every event is stored on the hub exactly once, the node's last value is
// in the hub's status stream, and no stream is on the leaf.
func TestLeafNodeAgentExactlyOnce(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
	hub, leaf, link := testenv.StartHubAndLeaf(t)
	nc := natsConn(t, hub.ClientURL())
	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state, "--nats-url", leaf.ClientURL(), "--nats-js-domain", testenv.HubDomain,
		"--uncollected-exit-grace", "1s", "--image-gc-high-threshold", "100", "--heartbeat-interval", "1s")
	natsWaitSynced(t, a)
	runDead(t, c, "before-1")
	waitRemoved(t, c, "before-1")
	waitDelivered(t, a, nc, []string{"before-1"}, 1)

	link.Cut()
	testenv.Eventually(t, 10*time.Second, func() string {
		if leaf.NumLeafNodes() != 0 {
			return "the leaf still has its link to the hub"
		}
		return ""
	})
	during := []string{"cut-1", "cut-2"}
	runDead(t, c, during...)
	waitRemoved(t, c, during...)
	testenv.Eventually(t, 30*time.Second, func() string {
		if n := containerGCRemoved(t, a); n < 3 {
			return fmt.Sprintf("container GC reports %d removals", n)
		}
		if d := metricSum(mustMetrics(t, a), "gcagent_natsbus_outbox_depth"); d < float64(len(during)) {
			return fmt.Sprintf("outbox depth %v while the hub is cut off", d)
		}
		return ""
	})
	if m := mustMetrics(t, a); metricSum(m, `gcagent_natsbus_mode{mode="core"}`) != 0 {
		t.Errorf("the agent fell back to core publish while the hub was cut off")
	}
	link.Restore()
	evs := waitDelivered(t, a, nc, append([]string{"before-1"}, during...), 1)
	t.Logf("%d events on the hub, each once, across the cut", len(evs))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, natsbus.DefaultStatusStream)
	if err != nil {
		t.Fatalf("status stream on the hub: %v", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, natsbus.StatusSubject(natsCluster, natsNode))
	if err != nil {
		t.Fatalf("node status on the hub: %v", err)
	}
	var ns schema.NodeStatus
	if err := json.Unmarshal(m.Data, &ns); err != nil || ns.Node != natsNode || ns.ImageGCHighThreshold != 100 || ns.HeartbeatIntervalSeconds != 1 {
		t.Errorf("node status %s (%v)", m.Data, err)
	}
	leafJS, _ := jetstream.New(natsConn(t, leaf.ClientURL()))
	for _, name := range []string{natsbus.DefaultStream, natsbus.DefaultStatusStream} {
		if _, err := leafJS.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s in the leaf's own domain: %v, want none", name, err)
		}
	}
}
