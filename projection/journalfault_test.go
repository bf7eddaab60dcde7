package projection

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

// TestJournalFaultAndResume makes the store fail under a running Live (its
// file closed, as a write fails on a full disk), checks that the projection
// keeps applying events while the failure is counted and reported, and that
// the next batch after the store works again writes a snapshot that covers
// the gap, so a restart restores everything.
func TestJournalFaultAndResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	now := at(100)
	l, err := NewLive(LiveOptions{Store: st, Registerer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	img := func(i int) events.Event {
		return events.ImageUpserted{At: at(i), Name: fmt.Sprintf("example.test/i%d:1", i), Digest: fmt.Sprintf("sha256:%d", i)}
	}
	l.Apply(img(1))
	if f := l.JournalFault(); f != nil {
		t.Fatalf("fault before any failure: %+v", f)
	}

	if err := st.db.Close(); err != nil { // every write fails from here
		t.Fatal(err)
	}
	l.Apply(img(2))
	l.Apply(img(3))
	// Two appends failed, and one snapshot: the second batch came within
	// snapshotRetry of the first attempt.
	f := l.JournalFault()
	if f == nil || f.Failures != 3 || f.Err == "" || !f.Since.Equal(at(100)) {
		t.Fatalf("fault after failed writes: %+v", f)
	}
	if got := testutil.ToFloat64(l.m.journalErrors); got != float64(f.Failures) {
		t.Fatalf("journal errors counted %v, fault says %d", got, f.Failures)
	}
	if n := len(l.Snapshot().Images); n != 3 {
		t.Fatalf("projection holds %d images while the journal fails, want 3", n)
	}

	// Space returns: the first batch after snapshotRetry persists
	// everything, gap included.
	if st.db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	l.Apply(img(4))
	if l.JournalFault() == nil {
		t.Fatal("a snapshot was tried again within snapshotRetry")
	}
	now = now.Add(snapshotRetry)
	l.Apply(img(5))
	if f := l.JournalFault(); f != nil {
		t.Fatalf("fault after the store works again: %+v", f)
	}
	want := l.Snapshot()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	res, err := st2.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.State.Images) != 5 || res.State.Seq != want.Seq {
		t.Fatalf("restored %d images at seq %d, want 5 at seq %d", len(res.State.Images), res.State.Seq, want.Seq)
	}
}
