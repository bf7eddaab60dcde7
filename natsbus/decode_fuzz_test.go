package natsbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// FuzzControlRequest feeds arbitrary payloads and verbs to the control
// request parser. It must never panic; what it accepts must be a known verb
// with a printable id of bounded size, and what it refuses must be a
// controlError (whose text goes back to the requester) with an id that is
// either empty or the printable one the request sent.
func FuzzControlRequest(f *testing.F) {
	for _, s := range []struct{ verb, data string }{
		{VerbStatus, `{"id":"r1"}`},
		{VerbPlan, `{"id":"r2","args":{}}`},
		{VerbExplain, `{"id":"r3","args":{"image":"example.test/a:1"}}`},
		{VerbExplain, `{"id":"r4","args":{"image":"  "}}`},
		{VerbGC, `{"id":"r5","args":null}`},
		{VerbStatus, `{"id":"r6","args":{"x":1}}`},
		{VerbStatus, `{"id":"r7"} {"id":"r8"}`},
		{"frobnicate", `{"id":"r9"}`},
		{VerbStatus, `{"id":"\u0000"}`},
		{VerbStatus, `{"id":"` + string(bytes.Repeat([]byte{'x'}, MaxRequestIDBytes+1)) + `"}`},
		{VerbStatus, `not json`},
		{VerbPlan, ``},
	} {
		f.Add(s.verb, []byte(s.data))
	}
	c := &control{sems: map[string]chan struct{}{}}
	for _, v := range Verbs {
		c.sems[v] = make(chan struct{}, 1)
	}
	f.Fuzz(func(t *testing.T, verb string, data []byte) {
		req, args, err := c.parse(&nats.Msg{Subject: ControlPrefix + ".default.n1." + verb, Data: data}, verb)
		if req.ID != "" && (len(req.ID) > MaxRequestIDBytes || !printable(req.ID)) {
			t.Fatalf("id %q echoed", req.ID)
		}
		if err != nil {
			var ce controlError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T) is not a controlError", err, err)
			}
			return
		}
		if _, ok := c.sems[verb]; !ok {
			t.Fatalf("unknown verb %q accepted", verb)
		}
		if req.ID == "" {
			t.Fatal("request without an id accepted")
		}
		if verb == VerbExplain {
			a, ok := args.(ExplainArgs)
			if !ok || a.Image == "" {
				t.Fatalf("explain accepted with args %#v", args)
			}
		} else if args != nil {
			t.Fatalf("%s accepted with args %#v", verb, args)
		}
	})
}

// FuzzOutboxEntry feeds arbitrary keys and values, as a corrupt outbox.db
// could hold them, to the outbox's record decoder. It must return an entry
// or an error, never panic; an entry it returns must carry an id, a subject
// and an event, and must encode back to the same record.
func FuzzOutboxEntry(f *testing.F) {
	good := entry{at: time.Unix(1700000000, 5), ID: "n1/image.removed/sha256:aa@1", Subject: "gcagent.v1.evt.default.n1.image.removed",
		Node: "n1", Kind: "image.removed", Event: json.RawMessage(`{"specversion":"1.0"}`)}
	v, err := encodeEntry(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seqKey(1), v)
	f.Add(seqKey(2), v[:8])
	f.Add([]byte{1, 2, 3}, v)
	f.Add(seqKey(3), append(v[:8:8], `{"id":"x","subject":"s","event":null}`...))
	f.Add(seqKey(4), append(v[:8:8], `{"id":"x","subject":"s","event":[1,2]`...))
	f.Fuzz(func(t *testing.T, k, v []byte) {
		e, err := decodeEntry(k, v)
		if err != nil {
			return
		}
		if e.ID == "" || e.Subject == "" || len(e.Event) == 0 {
			t.Fatalf("entry without id, subject or event accepted: %#v", e)
		}
		again, err := encodeEntry(e)
		if err != nil {
			t.Fatalf("encode %#v: %v", e, err)
		}
		back, err := decodeEntry(k, again)
		if err != nil {
			t.Fatalf("decode what encodeEntry wrote: %v", err)
		}
		if back.ID != e.ID || back.Subject != e.Subject || back.Node != e.Node || back.Kind != e.Kind ||
			!sameJSON(back.Event, e.Event) || !back.at.Equal(e.at) || back.seq != e.seq {
			t.Fatalf("round trip changed the entry:\n got %#v\nwant %#v", back, e)
		}
	})
}

// sameJSON compares two JSON texts byte for byte once insignificant
// whitespace is gone (encoding a RawMessage compacts it).
func sameJSON(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}
