package projection

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/trace"
)

func traceLine(r trace.Record, t0 time.Time) string {
	s := string(r.Ev) + " " + strings.TrimPrefix(r.Digest, "sha256:") + " @" + r.T.Sub(t0).String()
	if r.Ev == trace.KindImage {
		s += " " + strings.Join(r.Names, ",")
	}
	if r.Rule != "" {
		s += " " + r.Rule + "/" + r.Trigger
	}
	return s
}

func storedTrace(t *testing.T, st *Store, t0 time.Time) []string {
	t.Helper()
	var out []string
	skipped, err := trace.Read(st.DB(), func(r trace.Record) error {
		out = append(out, traceLine(r, t0))
		return nil
	})
	if err != nil || skipped.Any() {
		t.Fatal(err, skipped)
	}
	return out
}

// TestTraceFromEvents: the projection records, in the journal's
// transactions, each image's arrival, its uses and idles (idle at its
// last use), a rename, a removal and image GC's record of it; nothing for
// events that change no image; and after a restart it goes on from the
// restored state without repeating what the trace holds.
func TestTraceFromEvents(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.OpenTrace(trace.Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return at(100) }})
	if err != nil {
		t.Fatal(err)
	}
	l.Apply(img(at(0), "a:1", "sha256:a"), img(at(0), "b:1", "sha256:b"))
	l.Apply(events.ContainerUpserted{At: at(1), ID: "c1", Image: "a:1", ImageDigest: "sha256:a"})
	l.Apply(events.TaskStarted{At: at(2), ContainerID: "c1", Pid: 7}) // no change of use
	l.Apply(events.ContainerUpserted{At: at(3), ID: "c2", Image: "a:1", ImageDigest: "sha256:a"})
	l.Apply(events.ContainerDeleted{At: at(4), ID: "c1"}) // c2 still holds a
	l.Apply(events.ContainerDeleted{At: at(5), ID: "c2"})
	l.Apply(img(at(6), "a:2", "sha256:a"))
	l.Apply(events.ImageCollected{At: at(7), Digest: "sha256:b", Names: []string{"b:1"}, Size: 1, Rule: "space", Trigger: "disk"},
		events.ImageDeleted{At: at(7), Name: "b:1"})
	if got := storedTrace(t, st, t0); len(got) != 0 {
		t.Fatalf("records written before a thousand, a minute or a snapshot: %v", got)
	}
	l.snapshot()
	want := []string{
		"image a @0s a:1", "image b @0s b:1",
		"use a @1s",
		"idle a @5s",
		"image a @6s a:1,a:2",
		"gc b @7s space/disk", "gone b @7s",
	}
	if got := storedTrace(t, st, t0); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("trace:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart: the restored projection is what the trace says, so the
	// listing that finds nothing new adds nothing; a container created
	// while the agent was down is a use at the listing.
	st, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tl, err := st.OpenTrace(trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tl.Fresh() {
		t.Fatal("the trace is fresh after a restart")
	}
	l, err = NewLive(LiveOptions{Store: st, Now: func() time.Time { return at(100) }})
	if err != nil {
		t.Fatal(err)
	}
	l.Apply(events.Listing{At: at(50), Images: []events.ImageUpserted{img(at(50), "a:1", "sha256:a"), img(at(50), "a:2", "sha256:a")},
		Containers: []events.ContainerUpserted{{At: at(50), ID: "c3", Image: "a:2", ImageDigest: "sha256:a"}}})
	l.snapshot()
	got := storedTrace(t, st, t0)
	if tail := strings.Join(got[len(want):], "\n"); tail != "use a @50s" {
		t.Fatalf("after the restart the trace added:\n%s\nwant: use a @50s", tail)
	}
}

// TestTraceBaseOfAFreshTrace: a trace begun on a node whose projection is
// restored holds its images from the start, with first seen, last used
// and use.
func TestTraceBaseOfAFreshTrace(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLive(LiveOptions{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	l.Apply(img(t0, "a:1", "sha256:a"), img(t0, "b:1", "sha256:b"),
		events.ContainerUpserted{At: t0.Add(time.Second), ID: "c", Image: "b:1", ImageDigest: "sha256:b"})
	st.Close()

	st, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.OpenTrace(trace.Options{}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	if _, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return now }}); err != nil {
		t.Fatal(err)
	}
	recs, _, err := trace.Load(st.DB())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("base of %d records, want 2", len(recs))
	}
	for _, r := range recs {
		used := r.Digest == "sha256:b"
		if r.Ev != trace.KindImage || !r.T.Equal(now) || !r.FirstSeen.Equal(t0) || r.Used != used {
			t.Errorf("base record %+v", r)
		}
		if used && !r.LastUsed.Equal(t0.Add(time.Second)) {
			t.Errorf("b last used %s", r.LastUsed)
		}
	}
}

// TestTraceSurvivesACrash: records still in memory when the agent dies
// are made again from the journal at the next start, once: those of
// events the trace already holds are not repeated.
func TestTraceSurvivesACrash(t *testing.T) {
	t0 := time.Unix(1000, 0).UTC()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	path := filepath.Join(t.TempDir(), "state.db")
	now := at(0)
	open := func() (*Store, *Live) {
		st, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.OpenTrace(trace.Options{}); err != nil {
			t.Fatal(err)
		}
		l, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return st, l
	}
	st, l := open()
	l.Apply(img(at(0), "a:1", "sha256:a"))
	l.Apply(events.ContainerUpserted{At: at(1), ID: "c1", Image: "a:1", ImageDigest: "sha256:a"})
	now = at(120) // a minute later: the next batch takes the records with it
	l.Apply(events.ContainerDeleted{At: at(120), ID: "c1"})
	if got := storedTrace(t, st, t0); len(got) != 3 {
		t.Fatalf("after a minute the trace holds %v, want the 3 records", got)
	}
	l.Apply(img(at(121), "b:1", "sha256:b"))
	l.Apply(events.ContainerUpserted{At: at(122), ID: "c2", Image: "b:1", ImageDigest: "sha256:b"})
	st.Close() // kill -9: b's records were in memory only

	st, l = open()
	defer st.Close()
	l.snapshot()
	want := "image a @0s a:1\nuse a @1s\nidle a @2m0s\nimage b @2m1s b:1\nuse b @2m2s"
	if got := strings.Join(storedTrace(t, st, t0), "\n"); got != want {
		t.Fatalf("trace after the crash:\n%s\nwant:\n%s", got, want)
	}
}
