package deletion

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// holdLock is held at Begin; at Call it is held until deadline (and
// counts the calls that returned), or not any more (err).
type holdLock struct {
	deadline time.Time
	err      error
	done     int
}

func (l *holdLock) Held() error { return nil }

func (l *holdLock) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if l.err != nil {
		return ctx, func() {}, l.err
	}
	c, cancel := context.WithDeadline(ctx, l.deadline)
	return c, func() { l.done++; cancel() }, nil
}

// TestTxCallChecksTheLockRightBefore: Call checks the agent lock again
// right before the delete call and bounds it by the hold; its context is
// released once, when the transaction ends. When the hold ended since
// Begin, the context is already ended with the lock's error as its cause,
// and Settle says the delete did not happen without asking the node (no
// request left): the intent is dropped.
func TestTxCallChecksTheLockRightBefore(t *testing.T) {
	end := time.Now().Add(13 * time.Second)
	lock := &holdLock{deadline: end}
	j, c := &journal{}, &checker{err: errors.New("the node must not be asked")}
	m, err := New(Deps{Journal: j, Checker: c, Lock: lock}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := m.Begin(context.Background(), "ns", removal("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	call := tx.Call(context.Background())
	if dl, ok := call.Deadline(); !ok || !dl.Equal(end) || call.Err() != nil {
		t.Errorf("call context: deadline %v %v, err %v; want the end of the hold %v", dl, ok, call.Err(), end)
	}
	if err := tx.Commit(nil); err != nil || lock.done != 1 || call.Err() == nil {
		t.Errorf("commit: %v, %d releases, context %v: want the call's context released once", err, lock.done, call.Err())
	}
	_ = tx.Abort()
	if lock.done != 1 {
		t.Errorf("released %d times, want once", lock.done)
	}

	lock.err = errors.New("this agent does not hold containerd's agent lock now: not renewed for 20s")
	tx, err = m.Begin(context.Background(), "ns", removal("b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	call = tx.Call(context.Background())
	if call.Err() == nil || !errors.Is(context.Cause(call), lock.err) {
		t.Fatalf("call context when not held: %v (cause %v), want ended by the lock's error", call.Err(), context.Cause(call))
	}
	out, err := tx.Settle(context.Background())
	if out != NotHappened || !errors.Is(err, lock.err) {
		t.Errorf("settle: %v %v, want NotHappened with the lock's error", out, err)
	}
	if got, want := j.Log(), []string{"intend ns/a", "event ns/a", "intend ns/b", "abandon ns/b"}; !slices.Equal(got, want) || m.Unsettled() != 0 {
		t.Errorf("journal %q, %d unsettled: want %q, none", got, m.Unsettled(), want)
	}
}
