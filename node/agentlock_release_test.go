package node

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"

	"github.com/gcagent/gcagent/internal/clock"
)

// TestAgentLockGoesOnPastAReleaseAboveALeftLease (review of issue 40,
// finding 2): a release records its last generation so that the next
// holder goes on past it and no lock id is made twice. When a lower
// generation was left behind (its drop never reached containerd: drops
// are best effort, and a release deletes only the generation held), the
// next agent finds that lease at the top and must still go on past the
// release: the releaser's renewal sent just before it released (its
// answer lost) may land late, and with an id the new holder made again
// it would be taken for a take-over (the new holder stops), as would a
// late delete of that id remove the new holder's lease. Before the fix
// the record was read only when no lease was left (or the top was
// released while watched): b made lock.3 again, and its next renewal
// found lock.4 made by a, and stopped.
func TestAgentLockGoesOnPastAReleaseAboveALeftLease(t *testing.T) {
	store := &labelLeases{memLeases: newMemLeases(), labels: map[string]string{}}
	clk := clock.NewFake(time.Unix(1000, 0))
	procs := processes{1: true, 2: true}
	opts := LockOptions{Period: 10 * time.Second, Clock: clk, alive: procs.alive}
	a := NewAgentLock(store, agent("a", "sa", "pid:[1]", 1), opts)
	ctx := context.Background()
	if err := a.Acquire(ctx, false); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.renew(ctx); err != nil { // lock.3; lock.1 and lock.2 dropped
			t.Fatal(err)
		}
	}
	store.mu.Lock()
	aLabels := maps.Clone(store.leases["lock.3"].Labels)
	store.leases["lock.2"] = leases.Lease{ID: "lock.2", Labels: aLabels} // its drop never reached containerd
	store.fail = errors.New("rpc error: code = DeadlineExceeded")        // a's renewal: sent, answer lost
	store.mu.Unlock()
	if err := a.renew(ctx); err == nil {
		t.Fatal("the renewal did not fail")
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	a.Release() // records released.4: its renewal may land
	procs[1] = false

	b := NewAgentLock(store, agent("b", "sb", "pid:[1]", 2), opts)
	if err := b.Acquire(ctx, false); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	if gen <= 4 {
		t.Errorf("b holds lock.%d: an id a made (or may have made) is made again, below its release (released.4)", gen)
	}
	store.mu.Lock()
	store.leases["lock.4"] = leases.Lease{ID: "lock.4", Labels: aLabels} // a's renewal lands now
	store.mu.Unlock()
	if err := b.renew(ctx); err != nil {
		t.Errorf("b's renewal after a's late one landed: %v (b stops, though no agent runs beside it)", err)
	}
	if err := b.Held(); err != nil {
		t.Errorf("b: %v", err)
	}
}
