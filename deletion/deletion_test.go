package deletion

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/schema"
)

// journal is a Journal in memory; log records what happened in order.
type journal struct {
	mu        sync.Mutex
	seq       uint64
	pending   []Intent
	log       []string
	intendErr error
}

func (j *journal) Intend(ns string, a schema.Action, id *Identity) (Intent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.intendErr != nil {
		return Intent{}, j.intendErr
	}
	j.seq++
	in := Intent{Seq: j.seq, Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key, Identity: id}
	j.pending = append(j.pending, in)
	j.log = append(j.log, "intend "+ns+"/"+a.Subject)
	return in, nil
}

func (j *journal) drop(in Intent) bool {
	i := slices.IndexFunc(j.pending, func(p Intent) bool { return p.Seq == in.Seq })
	if i < 0 {
		return false
	}
	j.pending = slices.Delete(j.pending, i, i+1)
	return true
}

func (j *journal) Complete(in Intent, _ any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.drop(in) {
		j.log = append(j.log, "event "+in.Namespace+"/"+in.Subject)
	}
	return nil
}

func (j *journal) Abandon(in Intent) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.drop(in) {
		j.log = append(j.log, "abandon "+in.Namespace+"/"+in.Subject)
	}
	return nil
}

func (j *journal) Pending() ([]Intent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.pending), nil
}

func (j *journal) Publish(a schema.Action) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.log = append(j.log, "publish "+a.Subject)
	return nil
}

func (j *journal) Log() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.log)
}

// checker answers Gone from a set of gone subjects, or fails with err.
type checker struct {
	mu   sync.Mutex
	gone map[string]bool
	err  error
}

func (c *checker) Gone(_ context.Context, in Intent) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false, c.err
	}
	return c.gone[in.Namespace+"/"+in.Subject], nil
}

func (c *checker) set(gone map[string]bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone, c.err = gone, err
}

// stepClock is a settable time for RetryGap.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var testClock = &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}

func newManager(t *testing.T, j *journal, c *checker) *Manager {
	t.Helper()
	m, err := New(Deps{Journal: j, Checker: c}, Options{Clock: clock.System(testClock.Now)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func removal(id string) schema.Action {
	return schema.Action{Kind: "container", Action: "removed", Subject: id, Key: id}
}

func TestCommitAndAbort(t *testing.T) {
	j, c := &journal{}, &checker{}
	m := newManager(t, j, c)
	ctx := context.Background()
	a, _ := m.Begin(ctx, "ns", removal("a"), nil)
	b, _ := m.Begin(ctx, "ns", removal("b"), nil)
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(nil); err == nil {
		t.Error("a second commit of one transaction succeeded")
	}
	want := []string{"intend ns/a", "intend ns/b", "abandon ns/b", "event ns/a"}
	if got := j.Log(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestSettleAfterFailedCall: a failed call is settled at once: gone means
// the delete happened (the caller commits), there means it did not (the
// transaction is aborted).
func TestSettleAfterFailedCall(t *testing.T) {
	j, c := &journal{}, &checker{}
	m := newManager(t, j, c)
	ctx := context.Background()
	c.set(map[string]bool{"ns/gone": true}, nil)
	tx, _ := m.Begin(ctx, "ns", removal("gone"), nil)
	if out, err := tx.Settle(ctx); out != Happened || err != nil {
		t.Fatalf("gone: %v %v, want Happened", out, err)
	}
	_ = tx.Commit(nil)
	tx, _ = m.Begin(ctx, "ns", removal("there"), nil)
	if out, err := tx.Settle(ctx); out != NotHappened || err != nil {
		t.Fatalf("there: %v %v, want NotHappened", out, err)
	}
	want := []string{"intend ns/gone", "event ns/gone", "intend ns/there", "abandon ns/there"}
	if got := j.Log(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestUnknownOutcomeBlocksBegin: while containerd cannot say whether a
// delete happened, no other delete begins; once it can, the intent is
// settled first (invariant 6).
func TestUnknownOutcomeBlocksBegin(t *testing.T) {
	j, c := &journal{}, &checker{}
	m := newManager(t, j, c)
	ctx := context.Background()
	tx, _ := m.Begin(ctx, "ns", removal("a"), nil)
	c.set(nil, errors.New("containerd is stopped"))
	if out, err := tx.Settle(ctx); out != Unknown || err == nil {
		t.Fatalf("got %v %v, want Unknown with the error", out, err)
	}
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); !errors.Is(err, ErrUnsettled) {
		t.Fatalf("Begin while unsettled: %v, want ErrUnsettled", err)
	}
	if m.Unsettled() != 1 {
		t.Errorf("unsettled %d, want 1", m.Unsettled())
	}
	c.set(map[string]bool{"ns/a": true}, nil)
	// Within RetryGap of the failed check Begin fails fast, asking nothing.
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); !errors.Is(err, ErrUnsettled) {
		t.Fatalf("Begin right after the failed check: %v, want ErrUnsettled", err)
	}
	testClock.Step(2 * time.Second)
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); err != nil {
		t.Fatal(err)
	}
	want := []string{"intend ns/a", "event ns/a", "intend ns/b"}
	if got := j.Log(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestLeftoversSettledBeforeFirstDelete: intents a crash left are loaded
// and settled before the first Begin records anything.
func TestLeftoversSettledBeforeFirstDelete(t *testing.T) {
	j := &journal{pending: []Intent{
		{Seq: 1, Namespace: "a", Kind: "container", Subject: "x"},
		{Seq: 2, Namespace: "b", Kind: "container", Subject: "x"},
	}, seq: 2}
	c := &checker{gone: map[string]bool{"a/x": true}}
	m := newManager(t, j, c)
	if _, err := m.Begin(context.Background(), "a", removal("y"), nil); err != nil {
		t.Fatal(err)
	}
	// The same id in two namespaces is settled by its own namespace.
	want := []string{"event a/x", "abandon b/x", "intend a/y"}
	if got := j.Log(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestJournalFullDeletesWithoutIntent: when the intent cannot be written
// (the state disk is full) the delete goes on and its event is published
// on commit.
func TestJournalFullDeletesWithoutIntent(t *testing.T) {
	j, c := &journal{intendErr: errors.New("no space left on device")}, &checker{}
	m := newManager(t, j, c)
	tx, err := m.Begin(context.Background(), "ns", removal("a"), nil)
	if err != nil {
		t.Fatalf("Begin with a full journal: %v, want a transaction without intent", err)
	}
	if err := tx.Commit(nil); err != nil {
		t.Fatal(err)
	}
	if got := j.Log(); !slices.Equal(got, []string{"publish a"}) {
		t.Errorf("got %v, want the event published", got)
	}
}

// TestNoBeginWhileAFailedDeleteIsChecked: while one transaction asks the
// node whether its failed call happened, no other delete begins (the
// container executor runs several at once).
func TestNoBeginWhileAFailedDeleteIsChecked(t *testing.T) {
	j := &journal{}
	c := &blockingChecker{entered: make(chan struct{}), release: make(chan struct{})}
	m, err := New(Deps{Journal: j, Checker: c}, Options{Clock: clock.System(testClock.Now)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, _ := m.Begin(ctx, "ns", removal("a"), nil)
	done := make(chan Outcome)
	go func() {
		out, _ := a.Settle(ctx)
		done <- out
	}()
	<-c.entered
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); !errors.Is(err, ErrUnsettled) {
		t.Errorf("Begin while a failed delete is checked: %v, want ErrUnsettled", err)
	}
	close(c.release)
	if out := <-done; out != Happened {
		t.Fatalf("a: %v, want Happened", out)
	}
	_ = a.Commit(nil)
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); err != nil {
		t.Fatal(err)
	}
}

// blockingChecker says every object is gone, once released.
type blockingChecker struct {
	entered, release chan struct{}
	once             sync.Once
}

func (c *blockingChecker) Gone(ctx context.Context, _ Intent) (bool, error) {
	c.once.Do(func() { close(c.entered) })
	select {
	case <-c.release:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// TestUnknownWithoutIntentIsRemembered: a delete made without a durable
// intent (journal full) whose outcome is unknown blocks the next delete
// like any other, and is published if it happened.
func TestUnknownWithoutIntentIsRemembered(t *testing.T) {
	j, c := &journal{intendErr: errors.New("no space left on device")}, &checker{}
	m := newManager(t, j, c)
	ctx := context.Background()
	tx, _ := m.Begin(ctx, "ns", removal("a"), nil)
	c.set(nil, errors.New("containerd is stopped"))
	if out, _ := tx.Settle(ctx); out != Unknown {
		t.Fatalf("got %v, want Unknown", out)
	}
	if _, err := m.Begin(ctx, "ns", removal("b"), nil); !errors.Is(err, ErrUnsettled) {
		t.Fatalf("Begin: %v, want ErrUnsettled", err)
	}
	c.set(map[string]bool{"ns/a": true}, nil)
	testClock.Step(2 * time.Second)
	if err := m.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := j.Log(); !slices.Equal(got, []string{"publish a"}) {
		t.Errorf("got %v, want a's event published once settled", got)
	}
}

// TestRunSettlesAnUnknownOutcomeAlone: an unknown outcome with no delete
// after it is settled by Run as soon as the node answers, and Run's
// settled callback comes after the first settle that succeeds.
func TestRunSettlesAnUnknownOutcomeAlone(t *testing.T) {
	j, c := &journal{}, &checker{}
	ck := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m, err := New(Deps{Journal: j, Checker: c}, Options{Clock: ck})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, settled := make(chan error, 1), make(chan struct{})
	go func() { done <- m.Run(ctx, func() { close(settled) }) }()
	defer func() { cancel(); <-done }()
	wait.Until(t, 5*time.Second, "settled at start (nothing left)", func() bool {
		select {
		case <-settled:
			return true
		default:
			return false
		}
	})
	tx, _ := m.Begin(ctx, "ns", removal("a"), nil)
	c.set(nil, errors.New("containerd is stopped"))
	if out, _ := tx.Settle(ctx); out != Unknown {
		t.Fatalf("got %v, want Unknown", out)
	}
	c.set(map[string]bool{"ns/a": true}, nil)
	// Run retries on its timer, past RetryGap: no Begin is needed.
	wait.For(t, 5*time.Second, func() string {
		ck.Step(time.Second)
		if m.Unsettled() == 0 {
			return ""
		}
		return "a's unknown outcome is not settled"
	})
	if got := j.Log(); !slices.Equal(got, []string{"intend ns/a", "event ns/a"}) {
		t.Errorf("got %v, want a's event stored", got)
	}
}

// TestFullJournalStillSettles: once containerd has said what happened, the
// outcome is known even when its record cannot be written (a full state
// disk): GC starts and deletes go on; the next start settles it again.
func TestFullJournalStillSettles(t *testing.T) {
	j := &fullJournal{journal: journal{pending: []Intent{{Seq: 1, Namespace: "ns", Kind: "container", Subject: "c1"}}, seq: 1}}
	c := &checker{gone: map[string]bool{"ns/c1": true}}
	m, err := New(Deps{Journal: j, Checker: c}, Options{Clock: clock.System(testClock.Now)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(context.Background()); err != nil {
		t.Fatalf("Settle with a full journal: %v, want the outcome taken as known", err)
	}
	if m.Unsettled() != 0 || m.Generation() != 1 {
		t.Errorf("unsettled %d, generation %d: want 0 and 1", m.Unsettled(), m.Generation())
	}
	if _, err := m.Begin(context.Background(), "ns", removal("c2"), nil); err != nil {
		t.Errorf("Begin after: %v", err)
	}
}

// fullJournal cannot write an event: its disk is full.
type fullJournal struct{ journal }

func (j *fullJournal) Complete(Intent, any) error {
	return errors.New("no space left on device")
}

// TestCountsDoNotWaitForTheNode: while the node is asked about an
// unsettled delete (containerd hung), Unsettled and Generation (/readyz,
// the image GC's pass) answer at once, and a Begin fails fast.
func TestCountsDoNotWaitForTheNode(t *testing.T) {
	j := &journal{pending: []Intent{{Seq: 1, Namespace: "ns", Kind: "container", Subject: "c1"}}, seq: 1}
	c := &blockingChecker{entered: make(chan struct{}), release: make(chan struct{})}
	m, err := New(Deps{Journal: j, Checker: c}, Options{Clock: clock.System(testClock.Now)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Settle(context.Background()) }()
	<-c.entered
	answered := make(chan struct{})
	go func() {
		_, _ = m.Unsettled(), m.Generation()
		close(answered)
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("Unsettled and Generation waited for the node")
	}
	if _, err := m.Begin(context.Background(), "ns", removal("c2"), nil); !errors.Is(err, ErrUnsettled) {
		t.Errorf("Begin while the node is asked: %v, want ErrUnsettled at once", err)
	}
	close(c.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestBeginRecordsIdentity: the identity given to Begin is in the intent,
// also when the journal cannot record it and the delete goes on without.
func TestBeginRecordsIdentity(t *testing.T) {
	id := &Identity{Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	j := &journal{}
	m := newManager(t, j, &checker{})
	tx, err := m.Begin(context.Background(), "ns", removal("a"), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := tx.Intent().Identity; got != id || len(j.pending) != 1 || j.pending[0].Identity != id {
		t.Errorf("intent identity %+v (journal %+v), want %+v", got, j.pending, id)
	}
	j.intendErr = errors.New("disk full")
	tx, err = m.Begin(context.Background(), "ns", removal("b"), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := tx.Intent().Identity; got != id {
		t.Errorf("identity of a delete without a durable intent %+v, want %+v", got, id)
	}
}

// notHeld is a Lock this agent does not hold.
type notHeld struct{ err error }

func (l notHeld) Held() error { return l.err }

func (l notHeld) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	return ctx, func() {}, l.err
}

// TestBeginNeedsTheLock: while the agent does not hold containerd's agent
// lock, no delete begins and no intent is recorded.
func TestBeginNeedsTheLock(t *testing.T) {
	j := &journal{}
	lock := &notHeld{err: errors.New("another agent holds it")}
	m, err := New(Deps{Journal: j, Checker: &checker{}, Lock: lock}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Begin(context.Background(), "ns", removal("a"), nil); err == nil || err.Error() != "another agent holds it" {
		t.Errorf("Begin without the lock: %v, want the lock's error", err)
	}
	if len(j.pending) != 0 {
		t.Errorf("intents recorded without the lock: %+v", j.pending)
	}
	lock.err = nil
	if _, err := m.Begin(context.Background(), "ns", removal("a"), nil); err != nil {
		t.Errorf("Begin with the lock: %v", err)
	}
}

// TestIdentitySettles: settling compares identities, never a clock: a
// container is gone when not found or found with another creation time;
// an image name survives when recorded with its creation time. Without
// a recorded identity (an intent of an earlier version) whatever is found
// is the object: not gone.
func TestIdentitySettles(t *testing.T) {
	c1, c2 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 7, time.UTC)
	id := &Identity{Created: c1, Names: []Name{{Name: "a:1", Created: c1}}}
	var none *Identity
	for _, tc := range []struct {
		what string
		got  bool
		want bool
	}{
		{"container not found", id.ContainerGone(false, time.Time{}), true},
		{"container found, same creation", id.ContainerGone(true, c1), false},
		{"container found, made again (1 ns later)", id.ContainerGone(true, c2), true},
		{"old intent, container found", none.ContainerGone(true, c2), false},
		{"old intent, container not found", none.ContainerGone(false, time.Time{}), true},
		{"name recorded, same record", id.NameSurvives("a:1", c1), true},
		{"name recorded, made again", id.NameSurvives("a:1", c2), false},
		{"name not recorded", id.NameSurvives("a:2", c1), false},
		{"old intent, any name", none.NameSurvives("a:2", c2), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, tc.got, tc.want)
		}
	}
}
