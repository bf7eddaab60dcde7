package projection

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
)

func collectedAt(sec int, digest string, names ...string) events.ImageCollected {
	return events.ImageCollected{At: at(sec), Digest: digest, Names: names, Size: 7 << 20, Freed: 8 << 20, Rule: "space",
		Trigger: "disk", RegretUntil: at(sec).Add(time.Hour)}
}

func TestRegretWhenADeletedImageComesBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		back   events.ImageUpserted
		wantAs string // "" for no regret
	}{
		{"same name and digest", events.ImageUpserted{At: at(100), Name: "a:1", Digest: "sha256:a"}, "a:1"},
		{"same digest, new name", events.ImageUpserted{At: at(100), Name: "mirror.test/a:1", Digest: "sha256:a"}, "sha256:a"},
		{"a name it had, new digest", events.ImageUpserted{At: at(100), Name: "a:1", Digest: "sha256:a2"}, "a:1"},
		{"after the window", events.ImageUpserted{At: at(10 + 3601), Name: "a:1", Digest: "sha256:a"}, ""},
		{"another image", events.ImageUpserted{At: at(100), Name: "b:1", Digest: "sha256:b"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := apply(New(),
				events.ImageUpserted{At: at(1), Name: "a:1", Digest: "sha256:a", Size: 7 << 20},
				events.ImageDeleted{At: at(10), Name: "a:1"},
				collectedAt(10, "sha256:a", "a:1"),
				tc.back,
			)
			regrets := s.Regrets()
			if tc.wantAs == "" {
				if len(regrets) != 0 {
					t.Fatalf("regrets %+v, want none", regrets)
				}
				return
			}
			if len(regrets) != 1 || regrets[0].ReturnedAs != tc.wantAs || !regrets[0].ReturnedAt.Equal(at(100)) ||
				regrets[0].Size != 7<<20 || regrets[0].Rule != "space" || regrets[0].Trigger != "disk" || !regrets[0].At.Equal(at(10)) {
				t.Fatalf("regrets %+v, want one returned as %s", regrets, tc.wantAs)
			}
			// A second name of the same image is the same return.
			apply(s, events.ImageUpserted{At: at(101), Name: "sha256:cfg-a", Digest: tc.back.Digest})
			if r := s.Regrets(); len(r) != 1 || !r[0].ReturnedAt.Equal(at(100)) {
				t.Fatalf("after a second name: %+v", r)
			}
			// Reported once: the record goes, a later return is no regret.
			apply(s, events.RegretReported{At: at(102), Digest: "sha256:a", Deleted: at(10)},
				events.ImageDeleted{At: at(103), Name: "a:1"}, events.ImageUpserted{At: at(104), Name: "a:1", Digest: "sha256:a"})
			if r := s.Regrets(); len(r) != 0 || len(s.Deletions) != 0 {
				t.Fatalf("after the report: regrets %+v, deletions %+v", r, s.Deletions)
			}
		})
	}
}

// TestRegretNotWhileTheImageStays: a deletion recorded before containerd's
// delete events are applied is no regret for the names still there.
func TestRegretNotWhileTheImageStays(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(1), Name: "a:1", Digest: "sha256:a"},
		collectedAt(10, "sha256:a", "a:1"),
		events.ImageUpserted{At: at(11), Name: "a:1", Digest: "sha256:a"}, // a re-listing before the delete event
		events.ImageDeleted{At: at(12), Name: "a:1"},
	)
	if r := s.Regrets(); len(r) != 0 {
		t.Fatalf("regrets %+v", r)
	}
}

// TestRegretSurvivesRestart: a deletion and its return, each before a
// restart, are restored from the journal and from a snapshot.
func TestRegretSurvivesRestart(t *testing.T) {
	for _, snap := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "state.db")
		st, err := OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewLive(LiveOptions{Store: st, Now: func() time.Time { return at(50) }})
		if err != nil {
			t.Fatal(err)
		}
		l.Apply(events.ImageUpserted{At: at(1), Name: "a:1", Digest: "sha256:a"}, events.ImageDeleted{At: at(10), Name: "a:1"},
			collectedAt(10, "sha256:a", "a:1"))
		if snap {
			l.snapshot()
		}
		st.Close()
		st, err = OpenStore(path)
		if err != nil {
			t.Fatal(err)
		}
		l, err = NewLive(LiveOptions{Store: st, Now: func() time.Time { return at(60) }})
		if err != nil {
			t.Fatal(err)
		}
		l.Apply(events.ImageUpserted{At: at(60), Name: "a:1", Digest: "sha256:a"})
		if r := l.Snapshot().Regrets(); len(r) != 1 || r[0].ReturnedAs != "a:1" {
			t.Fatalf("snapshot %v: regrets after restart %+v", snap, r)
		}
		st.Close()
	}
}

func TestForgetDeletionsBefore(t *testing.T) {
	s := apply(New(), collectedAt(10, "sha256:a", "a:1"), collectedAt(20, "sha256:b", "b:1"),
		events.ImageUpserted{At: at(30), Name: "b:1", Digest: "sha256:b"})
	s.ForgetDeletionsBefore(at(10).Add(time.Hour + time.Second))
	if _, ok := s.Deletions["sha256:a"]; ok || len(s.Deletions) != 1 {
		t.Fatalf("deletions %+v: want only the returned one", s.Deletions)
	}
	if _, ok := s.deletedNames["a:1"]; ok {
		t.Fatal("the name index kept a forgotten deletion")
	}
	s.ForgetDeletionsBefore(at(30).Add(regretGrace + time.Second))
	if len(s.Deletions) != 0 {
		t.Fatalf("deletions %+v", s.Deletions)
	}
}
