package natsbus

import (
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
)

// TestEmbeddedStoreBoundOnAnOlderLargerStream: an embedded store created
// before the store bound holds a stream larger than the bound; the server
// refuses to shrink it. The publisher still delivers to it and says so in
// one line with the server's cause, instead of retrying forever with every
// event stuck in the outbox.
func TestEmbeddedStoreBoundOnAnOlderLargerStream(t *testing.T) {
	stateDir := t.TempDir()
	s, err := StartEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, s.ClientURL())
	p, err := NewPublisher(nc, PublisherOptions{Cluster: "c1", Node: "node-1", StateDir: stateDir}) // 1 GiB stream
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(action(1)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the first event stored", func() bool { return p.Depth() == 0 })
	_ = p.Close()
	nc.Close()
	s.Shutdown()
	s.WaitForShutdown()

	s, err = StartEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1", MaxStore: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc = connect(t, s.ClientURL())
	log := &logBuffer{}
	p = newPublisher(t, nc, stateDir, PublisherOptions{StreamMaxBytes: 256 << 20, Logger: log.logger()})
	if err := p.Publish(action(2)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 10*time.Second, "the second event stored", func() bool { return p.Depth() == 0 && p.Mode() == ModeJetStream })
	assertExactlyOnce(t, nc, []string{actionID(1), actionID(2)})
	if l := log.lines(t, "the server refuses this agent's stream config: using the existing stream as it is (delete it to get the new bounds)"); len(l) != 1 ||
		l[0]["error"] == nil || l[0]["max_bytes"] != float64(DefaultStreamMaxBytes) || l[0]["want_max_bytes"] != float64(256<<20) {
		t.Errorf("warning lines %v, want one with the cause, the stream's and the wanted max_bytes", l)
	} else {
		t.Logf("cause: %v", l[0]["error"])
	}
}
