package gc

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/schema"
)

// memJournal is a deletion.Journal in memory: a completed intent is
// published to pub under the intent's key, as the outbox stores it. log
// records "intend S", "complete S" and "abandon S" in order.
type memJournal struct {
	mu      sync.Mutex
	pub     Publisher
	seq     uint64
	pending map[uint64]deletion.Intent
	log     []string
	intents []deletion.Intent // every intent recorded, in order
	// failIntend, when set, fails every Intend.
	failIntend error
}

var _ deletion.Journal = (*memJournal)(nil)

func (j *memJournal) Intend(ns string, a schema.Action, id *deletion.Identity) (deletion.Intent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failIntend != nil {
		return deletion.Intent{}, j.failIntend
	}
	j.seq++
	d, err := json.Marshal(a.Data)
	if err != nil {
		return deletion.Intent{}, err
	}
	in := deletion.Intent{Seq: j.seq, Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject,
		Key: a.Key, Data: d, Identity: id} // the outbox makes it unique; tests assert the caller's key
	if j.pending == nil {
		j.pending = map[uint64]deletion.Intent{}
	}
	j.pending[in.Seq] = in
	j.intents = append(j.intents, in)
	j.log = append(j.log, "intend "+a.Subject)
	return in, nil
}

func (j *memJournal) Complete(in deletion.Intent, d any) error {
	j.mu.Lock()
	if _, ok := j.pending[in.Seq]; !ok {
		j.mu.Unlock()
		return nil
	}
	delete(j.pending, in.Seq)
	j.log = append(j.log, "complete "+in.Subject)
	pub := j.pub
	j.mu.Unlock()
	if d == nil {
		d = in.Data
	}
	if pub == nil {
		return nil
	}
	return pub.Publish(Action{Kind: in.Kind, Action: in.Action, Subject: in.Subject, Key: in.Key, Data: d})
}

func (j *memJournal) Abandon(in deletion.Intent) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.pending, in.Seq)
	j.log = append(j.log, "abandon "+in.Subject)
	return nil
}

func (j *memJournal) Pending() ([]deletion.Intent, error) { return nil, nil }

func (j *memJournal) Publish(a schema.Action) error {
	j.mu.Lock()
	j.log = append(j.log, "publish "+a.Subject)
	pub := j.pub
	j.mu.Unlock()
	if pub == nil {
		return nil
	}
	return pub.Publish(a)
}

func (j *memJournal) Log() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.log...)
}

// testDeletes returns delete transactions journaled in memory, published
// to pub, settled by c.
func testDeletes(t testing.TB, pub Publisher, c deletion.Checker) (*deletion.Manager, *memJournal) {
	t.Helper()
	j := &memJournal{pub: pub}
	m, err := deletion.New(deletion.Deps{Journal: j, Checker: c}, deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return m, j
}

// Gone says a container is gone once deleted (or never known alive).
func (f *fakeContainerRuntime) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err, ok := f.errs["gone "+in.Subject]; ok {
		return false, err
	}
	return f.live[in.Subject] == LiveGone, nil
}

// Gone says an image is gone once it has no name.
func (f *fakeRuntime) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs["gone "+in.Subject]; err != nil {
		return false, err
	}
	return len(f.names[in.Subject]) == 0, nil
}

// testDeletes1 is testDeletes without the journal.
func testDeletes1(t testing.TB, pub Publisher, c deletion.Checker) *deletion.Manager {
	t.Helper()
	m, _ := testDeletes(t, pub, c)
	return m
}

// mustExecutor is NewContainerExecutor that fails t on an error.
func mustExecutor(t testing.TB, d ContainerExecutorDeps, o ContainerExecutorOptions) *ContainerExecutor {
	t.Helper()
	e, err := NewContainerExecutor(d, o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// mustImageGC is NewImageGC that fails t on an error.
func mustImageGC(t testing.TB, d ImageGCDeps, o ImageGCOptions) *ImageGC {
	t.Helper()
	g, err := NewImageGC(d, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// runLoop runs a GC loop until the test ends, then checks it stopped
// cleanly within guard.
func runLoop(t *testing.T, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(guard):
			t.Errorf("Run did not return")
		}
	})
}
