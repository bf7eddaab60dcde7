package projection

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

func img(at time.Time, name, digest string) events.ImageUpserted {
	return events.ImageUpserted{At: at, Name: name, Digest: digest, Size: 1}
}

// TestSpaces: events go to their namespace's projection only; a Round
// makes them synced and drops a namespace it does not list; every
// namespace is restored from the one file, CRI's from the buckets older
// agents wrote.
func TestSpaces(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sp, err := NewSpaces(SpacesOptions{Store: st, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sp.Apply(
		events.Scoped{Namespace: "k8s.io", Event: events.Listing{At: t0, Images: []events.ImageUpserted{img(t0, "a:1", "sha256:a")}}},
		events.Scoped{Namespace: "default", Event: events.Listing{At: t0, Images: []events.ImageUpserted{img(t0, "a:1", "sha256:b")}}},
		events.Scoped{Namespace: "gone", Event: events.Listing{At: t0}},
	)
	if sp.Synced() {
		t.Fatal("synced before a Round")
	}
	sp.Apply(events.Scoped{Event: events.Round{At: t0, Namespaces: []string{"default", "k8s.io"}}},
		events.Scoped{Namespace: "default", Event: img(t0.Add(time.Second), "b:1", "sha256:c")})
	if !sp.Synced() {
		t.Fatal("not synced after a Round")
	}
	if got := sp.Names(); len(got) != 2 || got[0] != "default" || got[1] != "k8s.io" {
		t.Fatalf("namespaces %v, want [default k8s.io] (gone dropped by the Round)", got)
	}
	var seen []string
	sp.ViewAll(func(states []*State) {
		for _, s := range states {
			for d := range s.Images {
				seen = append(seen, s.Namespace+"/"+d)
			}
		}
	})
	if len(seen) != 3 {
		t.Fatalf("images %v, want sha256:b and sha256:c in default, sha256:a in k8s.io", seen)
	}
	sp.In("k8s.io").View(func(s *State) {
		if s.Images["sha256:a"] == nil || s.Images["sha256:b"] != nil {
			t.Errorf("k8s.io holds %v: another namespace's image leaked in", s.Images)
		}
	})
	if n := testutil.ToFloat64(sp.m.applied.WithLabelValues("default", string(events.KindImageUpserted))); n != 2 {
		t.Errorf("applied{namespace=default,kind=image.upserted} = %v, want 2", n)
	}
	for _, l := range sp.all() {
		l.snapshot()
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	names, err := st.Spaces()
	if err != nil || len(names) != 2 {
		t.Fatalf("persisted namespaces %v, %v: want default and k8s.io", names, err)
	}
	legacy, err := st.Load() // the file's first buckets: what agents before namespaces read
	if err != nil || legacy.State.Images["sha256:a"] == nil {
		t.Fatalf("k8s.io not in the first buckets: %v", err)
	}
	var logged bytes.Buffer
	sp2, err := NewSpaces(SpacesOptions{Store: st, Managed: func(ns string) bool { return ns != "default" },
		Live: LiveOptions{Log: zerolog.New(&logged)}})
	if err != nil {
		t.Fatal(err)
	}
	// A namespace's lines name it, once (a JSON key given twice is legal
	// but breaks log pipelines).
	if line := logged.String(); !strings.Contains(line, "projection restored") || strings.Count(line, `"namespace":"k8s.io"`) != 1 {
		t.Errorf("restore logged %q: want the namespace once", line)
	}
	if got := sp2.Names(); len(got) != 1 || got[0] != "k8s.io" {
		t.Fatalf("restored %v, want only the managed k8s.io", got)
	}
	if sp2.Synced() {
		t.Error("a restored projection is synced before a listing")
	}
}

// TestSnapshotDropsCoveredJournal: a snapshot deletes exactly the journal
// entries it covers, all of them or a prefix.
func TestSnapshotDropsCoveredJournal(t *testing.T) {
	st := tempStore(t)
	t0 := time.Unix(1000, 0).UTC()
	s := New()
	var evs []events.Event
	for i := range 100 {
		ev := img(t0, fmt.Sprintf("a:%d", i), fmt.Sprintf("sha256:%d", i))
		s.Apply(ev)
		evs = append(evs, ev)
	}
	if err := st.Append(s.Seq, evs); err != nil {
		t.Fatal(err)
	}
	covered := s.Clone()
	covered.Seq = 60 // as if the snapshot were taken after the 60th entry
	if err := st.Snapshot(covered); err != nil {
		t.Fatal(err)
	}
	if n, err := st.JournalLen(); err != nil || n != 40 {
		t.Fatalf("journal holds %d entries after a snapshot at 60 of 100, want 40 (%v)", n, err)
	}
	if err := st.Snapshot(s); err != nil {
		t.Fatal(err)
	}
	if n, err := st.JournalLen(); err != nil || n != 0 {
		t.Fatalf("journal holds %d entries after a snapshot covering all, want 0 (%v)", n, err)
	}
	if err := st.Append(s.Seq+1, []events.Event{img(t0, "b:1", "sha256:b")}); err != nil {
		t.Fatalf("append after the journal was dropped: %v", err)
	}
	res, err := st.Load()
	if err != nil || res.State.Images["sha256:b"] == nil || len(res.State.Images) != 101 {
		t.Fatalf("load: %d images, %v", len(res.State.Images), err)
	}
}

// TestLargeBatchWrittenAsSnapshot: a batch of a snapshot's worth of events
// (a first listing of a big node) is persisted as one snapshot, not as a
// journal entry per event, before anyone can read it.
func TestLargeBatchWrittenAsSnapshot(t *testing.T) {
	st := tempStore(t)
	l, err := NewLive(LiveOptions{Store: st, SnapshotEvery: 10})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0).UTC()
	listing := events.Listing{At: t0}
	for i := range 20 {
		listing.Images = append(listing.Images, img(t0, fmt.Sprintf("a:%d", i), fmt.Sprintf("sha256:%d", i)))
	}
	l.Apply(listing)
	if n, err := st.JournalLen(); err != nil || n != 0 {
		t.Fatalf("journal holds %d entries, want 0: the batch goes into a snapshot (%v)", n, err)
	}
	if n := testutil.ToFloat64(l.m.snapshots); n != 1 {
		t.Errorf("snapshots = %v, want 1", n)
	}
	l.Apply(img(t0.Add(time.Second), "b:1", "sha256:b")) // small batches go to the journal again
	if n, err := st.JournalLen(); err != nil || n != 1 {
		t.Fatalf("journal holds %d entries after one more event, want 1 (%v)", n, err)
	}
	res, err := st.Load()
	if err != nil || len(res.State.Images) != 21 || !res.State.Images["sha256:3"].FirstSeen.Time().Equal(t0) {
		t.Fatalf("restored %d images, %v", len(res.State.Images), err)
	}
}

// TestUsersRebuiltOnLoad: the use and name indexes are not persisted; a
// restored state has the same ones, rebuilt from its containers and images.
func TestUsersRebuiltOnLoad(t *testing.T) {
	st := tempStore(t)
	t0 := time.Unix(1000, 0).UTC()
	s := New()
	for _, ev := range []events.Event{
		events.ImageUpserted{At: t0, Name: "a:1", Digest: "sha256:a", ConfigDigest: "sha256:ca", ChainID: "sha256:xa"},
		events.ImageUpserted{At: t0, Name: "b:1", Digest: "sha256:b"},
		events.ContainerUpserted{At: t0, ID: "c1", Image: "a:1", ImageDigest: "sha256:a", ImageID: "sha256:ca"},
		events.ContainerUpserted{At: t0, ID: "c2", Image: "a:1", RootChain: "sha256:xa"},
		events.ContainerUpserted{At: t0, ID: "c3", Image: "b:1", VolumeImageIDs: []string{"sha256:ca"}},
	} {
		s.Apply(ev)
	}
	if s.users.len() == 0 {
		t.Fatal("test setup: no use keys")
	}
	if err := st.Snapshot(s); err != nil {
		t.Fatal(err)
	}
	res, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.State.users, s.users) {
		t.Fatalf("restored users %v, want %v", res.State.users, s.users)
	}
	if !reflect.DeepEqual(res.State.Names, s.Names) {
		t.Fatalf("restored names %v, want %v", res.State.Names, s.Names)
	}
}

// TestRunGathersABatch: events that arrive within the gather window wait
// for it and are applied (and journaled) as one batch, however far apart
// within it.
func TestRunGathersABatch(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	sp, err := NewSpaces(SpacesOptions{GatherWindow: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	changes := sp.Subscribe()
	in := make(chan events.Scoped)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sp.Run(ctx, in) }()
	for i := range 3 {
		in <- events.Scoped{Namespace: "k8s.io", Event: img(t0, fmt.Sprintf("a:%d", i), fmt.Sprintf("sha256:%d", i))}
		time.Sleep(20 * time.Millisecond) // the events spread over time inside the window, not a wait for a result
	}
	select {
	case <-changes:
		t.Fatal("a batch was applied before its window closed")
	default:
	}
	cancel() // ends the window: the batch is applied, then Run returns
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var seq uint64
	sp.ViewAll(func(states []*State) { seq = SeqOf(states) })
	if seq != 3 {
		t.Fatalf("seq %d after the batch, want 3", seq)
	}
}

// TestRunAfterRound: Run calls AfterRound once per applied batch that holds
// a Round, after applying it, and not for other batches.
func TestRunAfterRound(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	var sp *Spaces
	calls := make(chan bool, 4) // whether the round was applied when called
	sp, err := NewSpaces(SpacesOptions{GatherWindow: time.Millisecond, AfterRound: func() { calls <- sp.Synced() }})
	if err != nil {
		t.Fatal(err)
	}
	changes := sp.Subscribe()
	in := make(chan events.Scoped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sp.Run(ctx, in) }()
	in <- events.Scoped{Namespace: "k8s.io", Event: img(t0, "a:1", "sha256:1")}
	<-changes
	select {
	case <-calls:
		t.Fatal("AfterRound called for a batch without a Round")
	case <-time.After(50 * time.Millisecond):
	}
	in <- events.Scoped{Namespace: "k8s.io", Event: events.Listing{At: t0}}
	in <- events.Scoped{Event: events.Round{At: t0, Namespaces: []string{"k8s.io"}}}
	select {
	case synced := <-calls:
		if !synced {
			t.Fatal("AfterRound called before the Round was applied")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AfterRound not called after a Round")
	}
}

// tempStore opens a new store file in the test's temp dir, closed when the
// test ends.
func tempStore(t *testing.T) *Store {
	t.Helper()
	st, err := OpenStore(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
