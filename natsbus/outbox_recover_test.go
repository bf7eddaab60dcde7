package natsbus

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCorruptOutboxFileIsMovedAside: an outbox.db that bbolt cannot open
// (random bytes of several sizes, text) does not stop the publisher: the
// file is renamed outbox.db.corrupt-<time> with its bytes intact, one error
// line and gcagent_natsbus_outbox_corrupt_total say so, and the new empty
// outbox delivers events to a real server.
func TestCorruptOutboxFileIsMovedAside(t *testing.T) {
	random := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return b
	}
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	for i, garbage := range [][]byte{random(65536), random(5000), random(10), []byte("not a database\n")} {
		stateDir := t.TempDir()
		path := filepath.Join(stateDir, OutboxFile)
		if err := os.WriteFile(path, garbage, 0o600); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		m, err := NewMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		log := &logBuffer{}
		at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
		p, err := NewPublisher(nc, PublisherOptions{Cluster: "c1", Node: "node-1", StateDir: stateDir, Metrics: m, Logger: log.logger(),
			Now: func() time.Time { return at }})
		if err != nil {
			t.Fatalf("case %d: NewPublisher on a corrupt outbox: %v", i, err)
		}
		moved, _ := filepath.Glob(path + ".corrupt-*")
		if len(moved) != 1 || !strings.HasSuffix(moved[0], ".corrupt-20261123T120000.000000000Z") {
			t.Fatalf("case %d: moved files %v", i, moved)
		}
		if b, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(b, garbage) {
			t.Errorf("case %d: the corrupt file was not kept as it was (%v)", i, err)
		}
		if v := testutil.ToFloat64(m.corrupt); v != 1 {
			t.Errorf("case %d: outbox_corrupt_total %v", i, v)
		}
		lines := log.lines(t, "outbox cannot be opened: moved it aside and started an empty one; the events waiting in it are lost")
		if len(lines) != 1 || lines[0]["level"] != "error" || lines[0]["moved_to"] != moved[0] {
			t.Errorf("case %d: log lines %v", i, lines)
		}
		if err := p.Publish(action(i)); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, 10*time.Second, "the event delivered from the new outbox", func() bool { return p.Depth() == 0 })
		_ = p.Close()
	}
	if n := streamCount(nc); n != 4 {
		t.Errorf("stream holds %d events, want 4", n)
	}
}

// TestLockedOutboxIsNotMovedAside: an outbox held by another publisher is
// not corrupt: NewPublisher fails and leaves the file where it is.
func TestLockedOutboxIsNotMovedAside(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	stateDir := t.TempDir()
	newPublisher(t, nc, stateDir, PublisherOptions{})
	if _, err := NewPublisher(nc, PublisherOptions{Cluster: "c1", Node: "node-1", StateDir: stateDir}); err == nil {
		t.Fatal("a second publisher opened a held outbox")
	}
	if moved, _ := filepath.Glob(filepath.Join(stateDir, OutboxFile) + ".corrupt-*"); len(moved) != 0 {
		t.Fatalf("a held outbox was moved aside: %v", moved)
	}
}
