package natsbus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestDecodeKeep: only a delete (no value) or an explicit "patterns": []
// is an empty list; a value written wrongly is an error, so that an agent
// keeps the list it had instead of dropping every fleet pattern. Only
// patterns is needed: a field this version does not know (a newer ctl, a
// hand-written `nats kv put`) and informational fields in another form
// are ignored. On d7dd547 a value with an unknown field was an error.
func TestDecodeKeep(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
		ok    bool
	}{
		{``, nil, true},
		{`{"patterns":[]}`, []string{}, true},
		{`{"patterns":["reg/app:*"],"updatedAt":"2026-11-26T12:00:00Z","updatedBy":"ops"}`, []string{"reg/app:*"}, true},
		{`{"images":["reg/app:*"]}`, nil, false},
		{`{"patterns":["a"],"images":["b"]}`, []string{"a"}, true},
		{`{"patterns":["reg/app:*"],"updatedAt":"2026-11-26T12:00:00Z","updatedBy":"ops","source":{"kind":"cluster","state":"complete"}}`, []string{"reg/app:*"}, true},
		{`{"patterns":["a"],"updatedAt":1764158400,"updatedBy":{"user":"ops"}}`, []string{"a"}, true},
		{`{"patterns":[1]}`, nil, false},
		{`{"patterns":["a",null]}`, nil, false},
		{`{"patterns":{"a":1}}`, nil, false},
		{`{}`, nil, false},
		{`{"patterns":null}`, nil, false},
		{`null`, nil, false},
		{`["reg/app:*"]`, nil, false},
		{`{"patterns":"reg/app:*"}`, nil, false},
	} {
		l, err := DecodeKeep([]byte(tc.value))
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", tc.value, err, tc.ok)
			continue
		}
		if tc.ok && !slices.Equal(l.Patterns, tc.want) {
			t.Errorf("%s: patterns %q, want %q", tc.value, l.Patterns, tc.want)
		}
	}
}

// TestEditKeepKeepsUnknownFields: editing a value a newer writer made
// changes its patterns and keeps the fields this version does not know.
func TestEditKeepKeepsUnknownFields(t *testing.T) {
	nc := connect(t, runServer(t, -1, t.TempDir(), true).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	kv, err := EnsureKeepBucket(ctx, js, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, KeepAllKey, []byte(`{"patterns":["a/*"],"state":"complete","sources":{"a/*":["deploy/web"]},"updatedBy":"syncer"}`)); err != nil {
		t.Fatal(err)
	}
	l, err := EditKeep(ctx, kv, KeepAllKey, "ops", time.Now, func(p []string) ([]string, error) { return append(p, "b/*"), nil })
	if err != nil || !slices.Equal(l.Patterns, []string{"a/*", "b/*"}) {
		t.Fatalf("edit: %+v %v", l, err)
	}
	e, err := kv.Get(ctx, KeepAllKey)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		t.Fatal(err)
	}
	if got["state"] != "complete" || got["sources"] == nil || got["updatedBy"] != "ops" || fmt.Sprint(got["patterns"]) != "[a/* b/*]" {
		t.Errorf("stored %s", e.Value())
	}
}
