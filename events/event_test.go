package events

import (
	"reflect"
	"testing"
	"time"
)

func TestMarshalRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, ev := range []Event{
		ImageUpserted{At: at, Name: "a", Digest: "sha256:x", Labels: map[string]string{"k": "v"}, Size: 9, Created: at},
		ImageDeleted{At: at, Name: "a"},
		ContainerUpserted{At: at, ID: "c", Image: "a", CRIKind: "sandbox", PodUID: "u", Created: at},
		ContainerDeleted{At: at, ID: "c"},
		TaskStarted{At: at, ContainerID: "c", Pid: 1},
		TaskExited{At: at, ContainerID: "c", Pid: 1, ExitStatus: 2, ExitedAt: at},
		Synced{At: at},
	} {
		b, err := Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Unmarshal(b)
		if err != nil || !reflect.DeepEqual(back, ev) {
			t.Fatalf("%s: round trip %#v, %v", ev.Kind(), back, err)
		}
	}
	if _, err := Unmarshal([]byte(`{"k":"image.exploded","e":{}}`)); err == nil {
		t.Fatal("unknown kind accepted")
	}
	if _, err := Unmarshal([]byte(`{not json`)); err == nil {
		t.Fatal("garbage accepted")
	}
}
