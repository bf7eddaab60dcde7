package natsbus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStreamConfigAcrossRestarts runs the agent's side the way a pod
// restart does: the embedded server and the publisher start again on the
// same state dir. With unchanged settings (the stream as large as the
// store, the agent's default), two restarts log no warning and leave the
// stream as it was; a smaller bound is applied and logged once; a bound the
// server refuses (larger than the store) leaves the stream as it is, with
// one warning line that names the cause, and events are still stored.
func TestStreamConfigAcrossRestarts(t *testing.T) {
	const maxStore = 8 << 20
	stateDir := t.TempDir()
	seed, pub, err := EnsureLocalNkey(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	// start runs the server and a publisher with the stream bound
	// streamMaxBytes, stores one event, and returns the publisher's log and
	// the stream's config; everything is closed before it returns.
	start := func(t *testing.T, streamMaxBytes int64) (*logBuffer, jetstream.StreamConfig) {
		t.Helper()
		e, err := RunEmbedded(EmbeddedOptions{StateDir: stateDir, Listen: "127.0.0.1:-1", AuthNkey: pub, MaxStore: maxStore},
			EmbeddedRunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		agent, err := Connect(ConnOptions{URL: "nats://embedded", Cluster: "c1", Node: "node-1", NkeyFile: seed, InProcess: e})
		if err != nil {
			t.Fatal(err)
		}
		defer agent.Close()
		logs := &logBuffer{}
		p, err := NewPublisher(agent, PublisherOptions{Cluster: "c1", Node: "node-1", StateDir: stateDir,
			StreamMaxBytes: streamMaxBytes, Logger: logs.logger()})
		if err != nil {
			t.Fatal(err)
		}
		n++
		if err := p.Publish(action(n)); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, 10*time.Second, "the event stored", func() bool { return p.Depth() == 0 && p.Mode() == ModeJetStream })
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(agent)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		return logs, s.CachedInfo().Config
	}
	warnings := func(b *logBuffer) []string {
		b.mu.Lock()
		defer b.mu.Unlock()
		var out []string
		for _, l := range strings.Split(b.buf.String(), "\n") {
			if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
				out = append(out, l)
			}
		}
		return out
	}

	_, first := start(t, maxStore)
	if first.MaxBytes != maxStore {
		t.Fatalf("created stream max_bytes %d, want %d", first.MaxBytes, maxStore)
	}
	for i := 1; i <= 2; i++ {
		logs, cfg := start(t, maxStore)
		if w := warnings(logs); len(w) > 0 {
			t.Errorf("restart %d with unchanged settings logged %d warnings: %s", i, len(w), strings.Join(w, "\n"))
		}
		if cfg.MaxBytes != maxStore || cfg.MaxAge != first.MaxAge {
			t.Errorf("restart %d: stream max_bytes %d max_age %s, want unchanged", i, cfg.MaxBytes, cfg.MaxAge)
		}
	}

	logs, cfg := start(t, maxStore/2)
	if cfg.MaxBytes != maxStore/2 {
		t.Errorf("a smaller bound: stream max_bytes %d, want %d", cfg.MaxBytes, maxStore/2)
	}
	if w := warnings(logs); len(w) > 0 {
		t.Errorf("a smaller bound the server accepts logged warnings: %s", strings.Join(w, "\n"))
	}
	if l := logs.lines(t, "stream config updated"); len(l) != 1 || l[0]["max_bytes"] != float64(maxStore/2) || l[0]["was_max_bytes"] != float64(maxStore) {
		t.Errorf("stream update logged %v, want one line with max_bytes and was_max_bytes", l)
	}

	logs, cfg = start(t, 2*maxStore)
	if cfg.MaxBytes != maxStore/2 {
		t.Errorf("a bound the server refuses: stream max_bytes %d, want it left at %d", cfg.MaxBytes, maxStore/2)
	}
	w := warnings(logs)
	if len(w) != 1 || !strings.Contains(w[0], "insufficient storage") || !strings.Contains(w[0], "the server refuses this agent's stream config: using the existing stream as it is (delete it to get the new bounds)") {
		t.Errorf("a refused bound logged %d warnings, want one naming the cause:\n%s", len(w), strings.Join(w, "\n"))
	}
	t.Logf("refused: %s", strings.Join(w, ""))
}
