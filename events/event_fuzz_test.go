package events

import (
	"reflect"
	"testing"
	"time"
)

// FuzzUnmarshal feeds arbitrary journal records to Unmarshal: it must return
// an event or an error, never panic, and an event it returns must encode
// back to a record that decodes to the same event.
func FuzzUnmarshal(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, ev := range []Event{
		ImageUpserted{At: at, Name: "example.test/a:1", Digest: "sha256:aa", Size: 10, Labels: map[string]string{"io.cri-containerd.pinned": "pinned"}},
		ImageDeleted{At: at, Name: "example.test/a:1"},
		ContainerUpserted{At: at, ID: "c1", Image: "example.test/a:1", ImageDigest: "sha256:aa", CRIKind: "container", PodUID: "u1"},
		ContainerDeleted{At: at, ID: "c1"},
		TaskStarted{At: at, ContainerID: "c1", Pid: 7},
		TaskExited{At: at, ContainerID: "c1", Pid: 7, ExitStatus: 1, ExitedAt: at},
		Synced{At: at},
	} {
		b, err := Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"k":"image.upserted","e":null}`))
	f.Add([]byte(`{"k":"task.exited","e":{"At":"not a time"}}`))
	f.Add([]byte(`{"k":"from.the.future","e":{}}`))
	f.Add([]byte{0, 0, 0, 0})

	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Unmarshal(b)
		if err != nil {
			return
		}
		again, err := Marshal(ev)
		if err != nil {
			t.Fatalf("encode %#v: %v", ev, err)
		}
		back, err := Unmarshal(again)
		if err != nil {
			t.Fatalf("decode what Marshal wrote (%s): %v", again, err)
		}
		if !eventsEqual(ev, back) {
			t.Fatalf("round trip changed the event:\n got %#v\nwant %#v", back, ev)
		}
	})
}

// eventsEqual compares events as the journal sees them: times by instant
// (JSON drops the monotonic reading and the location name), and an empty
// map equal to a nil one.
func eventsEqual(a, b Event) bool {
	ja, errA := Marshal(a)
	jb, errB := Marshal(b)
	return errA == nil && errB == nil && reflect.DeepEqual(ja, jb) && a.Kind() == b.Kind() && a.Time().Equal(b.Time())
}
