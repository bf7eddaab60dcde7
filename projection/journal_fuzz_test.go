package projection

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
)

// FuzzJournalReplay replays arbitrary journal records the way Load does:
// each record that decodes is applied to one State. Replay must never panic,
// whatever order or content the records have, and the state it reaches must
// survive the snapshot encoding (what a restart restores) unchanged.
func FuzzJournalReplay(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := func(evs ...events.Event) []byte {
		var buf bytes.Buffer
		for _, ev := range evs {
			b, err := events.Marshal(ev)
			if err != nil {
				f.Fatal(err)
			}
			buf.Write(b)
			buf.WriteByte('\n')
		}
		return buf.Bytes()
	}
	f.Add(rec(
		events.ImageUpserted{At: at, Name: "a:1", Digest: "sha256:aa", Size: 10},
		events.ImageUpserted{At: at, Name: "sha256:cc", Digest: "sha256:aa", Size: 10},
		events.ContainerUpserted{At: at, ID: "c1", Image: "a:1", ImageDigest: "sha256:aa", CRIKind: "sandbox", PodUID: "u1"},
		events.TaskStarted{At: at, ContainerID: "c1", Pid: 1},
		events.TaskExited{At: at.Add(time.Second), ContainerID: "c1", Pid: 1, ExitedAt: at.Add(time.Second)},
		events.ContainerDeleted{At: at.Add(2 * time.Second), ID: "c1"},
		events.ImageDeleted{At: at.Add(3 * time.Second), Name: "a:1"},
		events.Synced{At: at},
	))
	f.Add(rec(
		events.ContainerDeleted{At: at, ID: "never-seen"},
		events.TaskExited{At: at, ContainerID: "never-seen"},
		events.ImageDeleted{At: at, Name: "never-seen"},
		events.ContainerUpserted{At: at, ID: "c2", Image: "b:1"},
		events.ImageUpserted{At: at, Name: "b:1", Digest: "sha256:bb"},
		events.ImageUpserted{At: at, Name: "b:1", Digest: "sha256:b2"},
	))
	f.Add([]byte("{\"k\":\"container.upserted\",\"e\":{\"id\":\"\"}}\n{}\n\x00\xff"))

	f.Fuzz(func(t *testing.T, data []byte) {
		s := New()
		for _, line := range bytes.Split(data, []byte{'\n'}) {
			ev, err := events.Unmarshal(line)
			if err != nil {
				continue // Load skips what it cannot decode
			}
			s.Apply(ev)
			checkDeadIndex(t, s)
			if img := s.Images[s.Names[nameOf(ev)]]; img != nil {
				_ = s.LastUsed(img, at)
			}
		}
		b, err := json.Marshal(s)
		if err != nil {
			return // a time out of JSON's range: Snapshot reports it, Load never sees it
		}
		back := New()
		if err := json.Unmarshal(b, back); err != nil {
			t.Fatalf("snapshot does not decode: %v\n%s", err, b)
		}
		back.fill()
		checkDeadIndex(t, back)
		checkDeadIndex(t, s.Clone())
		again, err := json.Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, again) {
			t.Fatalf("snapshot round trip changed the state:\n%s\n%s", b, again)
		}
	})
}

// checkDeadIndex fails unless the dead index holds exactly the dead
// containers.
func checkDeadIndex(t *testing.T, s *State) {
	t.Helper()
	n := 0
	for id, c := range s.Containers {
		if got, ok := s.dead[id]; ok != c.Dead() || ok && got != c {
			t.Fatalf("container %s (%s): in the dead index %v, as %p (the container is %p)", id, c.State, ok, got, c)
		}
		if c.Dead() {
			n++
		}
	}
	if len(s.dead) != n {
		t.Fatalf("the dead index holds %d containers, %d are dead", len(s.dead), n)
	}
}

func nameOf(ev events.Event) string {
	if e, ok := ev.(events.ImageUpserted); ok {
		return e.Name
	}
	return ""
}
