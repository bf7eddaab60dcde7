package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/projection"
	"github.com/rs/zerolog"
)

// recorder is a sdNotifier that keeps what it was sent.
type recorder struct {
	mu   sync.Mutex
	sent []string
}

func (r *recorder) notify(s string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, s)
	return true, nil
}

func (r *recorder) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sent {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// TestSystemdNotifyReadyAfterSyncAndWatchdogWhileHealthy: no READY=1 before
// the projection is synced, exactly one after; WATCHDOG=1 while the loop is
// healthy, none while it is not, again once it recovers; STOPPING=1 at the
// end.
func TestSystemdNotifyReadyAfterSyncAndWatchdogWhileHealthy(t *testing.T) {
	var synced, unhealthy atomic.Bool
	var checks atomic.Int64
	changes := make(chan struct{}, 1)
	rec := &recorder{}
	s := &systemdNotify{
		notify: rec.notify, synced: synced.Load, changes: changes, watchdog: 4 * time.Millisecond,
		check: func() error {
			checks.Add(1)
			if unhealthy.Load() {
				return errors.New("wedged")
			}
			return nil
		},
		log: zerolog.Nop(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()

	wait.Until(t, 10*time.Second, "watchdog pings before sync", func() bool { return rec.count("WATCHDOG=1") >= 3 })
	changes <- struct{}{}
	if rec.count("READY=1") != 0 {
		t.Fatal("READY=1 before the projection is synced")
	}
	synced.Store(true)
	changes <- struct{}{}
	wait.Until(t, 10*time.Second, "READY=1 after sync", func() bool { return rec.count("READY=1") == 1 })

	unhealthy.Store(true)
	c0 := checks.Load()
	wait.Until(t, 10*time.Second, "checks while unhealthy", func() bool { return checks.Load() >= c0+2 })
	pings := rec.count("WATCHDOG=1")
	c1 := checks.Load()
	wait.Until(t, 10*time.Second, "more checks while unhealthy", func() bool { return checks.Load() >= c1+5 })
	if got := rec.count("WATCHDOG=1"); got != pings {
		t.Errorf("%d watchdog pings while the loop was unhealthy", got-pings)
	}
	unhealthy.Store(false)
	wait.Until(t, 10*time.Second, "pings after recovery", func() bool { return rec.count("WATCHDOG=1") >= pings+2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rec.count("READY=1") != 1 || rec.count("STOPPING=1") != 1 {
		t.Errorf("sent %v", rec.sent)
	}
	if i, j := slices.IndexFunc(rec.sent, func(s string) bool { return strings.HasPrefix(s, "READY=1") }), len(rec.sent)-1; rec.sent[j] != "STOPPING=1" || i < 0 {
		t.Errorf("order: %v", rec.sent)
	}
}

// TestLoopHealth: a projection that does not answer a read, or a full queue
// with nothing applied between two checks, is unhealthy; a full queue that
// drains is not.
func TestLoopHealth(t *testing.T) {
	seq, queued := uint64(1), 0
	block := make(chan struct{})
	blocking := false
	h := &loopHealth{
		queued: func() (int, int) { return queued, 4 },
		view: func(fn func([]*projection.State)) {
			if blocking {
				<-block
			}
			fn([]*projection.State{{Seq: seq}})
		},
		timeout: 20 * time.Millisecond,
	}
	if err := h.check(); err != nil {
		t.Fatalf("idle loop: %v", err)
	}
	queued = 4
	if err := h.check(); err != nil {
		t.Fatalf("first full check: %v", err)
	}
	seq = 2
	if err := h.check(); err != nil {
		t.Fatalf("full but applying: %v", err)
	}
	if err := h.check(); err == nil {
		t.Fatal("full twice with nothing applied: healthy")
	}
	queued = 0
	blocking = true
	if err := h.check(); err == nil {
		t.Fatal("projection not answering: healthy")
	}
	if err := h.check(); err == nil {
		t.Fatal("probe still blocked: healthy")
	}
	close(block)
	wait.Until(t, 10*time.Second, "healthy after the read answers", func() bool { return h.check() == nil })
}
