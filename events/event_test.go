package events

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
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
		ImageCollected{At: at, Digest: "sha256:x", Names: []string{"a", "sha256:c"}, Size: 9, Freed: 8, Rule: "space",
			Trigger: "disk", RegretUntil: at.Add(24 * time.Hour)},
		RegretReported{At: at, Digest: "sha256:x", Deleted: at},
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

// TestDecodeRegretEvents decodes the journal entries of the regret events
// as an agent wrote them: the field names are the journal's format.
func TestDecodeRegretEvents(t *testing.T) {
	at := time.Date(2026, 11, 26, 18, 0, 0, 0, time.UTC)
	ev, err := Unmarshal([]byte(`{"k":"image.collected","e":{"at":"2026-11-26T18:00:00Z","digest":"sha256:d",` +
		`"names":["x.test/a:1"],"size":1048576,"freed":2097152,"rule":"space","trigger":"disk","regretUntil":"2026-11-27T18:00:00Z"}}`))
	want := ImageCollected{At: at, Digest: "sha256:d", Names: []string{"x.test/a:1"}, Size: 1 << 20, Freed: 2 << 20,
		Rule: "space", Trigger: "disk", RegretUntil: at.Add(24 * time.Hour)}
	if err != nil || !reflect.DeepEqual(ev, want) {
		t.Fatalf("image.collected: %#v, %v", ev, err)
	}
	ev, err = Unmarshal([]byte(`{"k":"image.regret_reported","e":{"at":"2026-11-26T18:00:00Z","digest":"sha256:d","deleted":"2026-11-26T18:00:00Z"}}`))
	if err != nil || !reflect.DeepEqual(ev, RegretReported{At: at, Digest: "sha256:d", Deleted: at}) {
		t.Fatalf("image.regret_reported: %#v, %v", ev, err)
	}
	if _, err := Unmarshal([]byte(`{"k":"image.collected","e":{"size":"big"}}`)); err == nil {
		t.Fatal("a malformed image.collected was accepted")
	}
}

// TestKindsIsTheClosedSet: Kinds names every Kind constant declared in
// event.go, and each decodes to an event of its kind.
func TestKindsIsTheClosedSet(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "event.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[Kind]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Kind" {
				continue
			}
			for _, val := range v.Values {
				lit, _ := strconv.Unquote(val.(*ast.BasicLit).Value)
				declared[Kind(lit)] = true
			}
		}
	}
	if len(declared) != len(Kinds) {
		t.Fatalf("event.go declares %d kinds, Kinds lists %d", len(declared), len(Kinds))
	}
	for _, k := range Kinds {
		if !declared[k] {
			t.Errorf("Kinds lists %q, which event.go does not declare", k)
		}
		ev, err := Unmarshal([]byte(`{"k":"` + string(k) + `","e":{}}`))
		if err != nil || ev.Kind() != k {
			t.Errorf("kind %q: decoded %v, %v", k, ev, err)
		}
	}
}
