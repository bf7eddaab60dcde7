package natsbus

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestSafeToken(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "node-1", "node-1"},
		{"underscore kept", "a_b", "a_b"},
		{"dots", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1_ec2_internal"},
		{"wildcards", "a*b>c", "a_b_c"},
		{"whitespace", "a b\tc\nd", "a_b_c_d"},
		{"non-printable", "a\x00b\x7fc", "a_b_c"},
		{"non-ASCII bytes each", "né", "n__"},
		{"empty", "", "_"},
		{"only a dot", ".", "_"},
		{"ref chars are legal", "reg/img:tag@x", "reg/img:tag@x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SafeToken(tc.in)
			if got != tc.want {
				t.Fatalf("SafeToken(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if SafeToken(got) != got {
				t.Fatalf("SafeToken is not idempotent on %q", got)
			}
		})
	}
}

func TestSubjects(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"event", Subject("default", "node-1", "image", "removed"), "gcagent.v1.evt.default.node-1.image.removed"},
		{"event with dotted node", Subject("prod", "n1.example.com", "gc", "completed"), "gcagent.v1.evt.prod.n1_example_com.gc.completed"},
		{"event with empty cluster", Subject("", "n", "log", "removed"), "gcagent.v1.evt._.n.log.removed"},
		{"control", ControlSubject("default", "node-1", "status"), "gcagent.v1.ctl.default.node-1.status"},
		{"control all", ControlSubject("default", AllNodes, "gc"), "gcagent.v1.ctl.default.all.gc"},
		{"control hostile node", ControlSubject("c", "a.>", "plan"), "gcagent.v1.ctl.c.a__.plan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

func TestEventID(t *testing.T) {
	a := EventID("c", "n", "image", "removed", "k")
	if a != EventID("c", "n", "image", "removed", "k") {
		t.Fatal("EventID is not deterministic")
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Fatalf("EventID %q is not 32 hex digits", a)
	}
	for _, other := range []string{
		EventID("c2", "n", "image", "removed", "k"),
		EventID("c", "n2", "image", "removed", "k"),
		EventID("c", "n", "container", "removed", "k"),
		EventID("c", "n", "image", "skipped", "k"),
		EventID("c", "n", "image", "removed", "k2"),
	} {
		if other == a {
			t.Fatal("EventID ignores one of its inputs")
		}
	}
}

func TestNewEventJSON(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	ev, err := NewEvent("prod", "node-1", Action{
		Kind: "image", Action: "removed", Subject: "sha256:abc", Key: "sha256:abc/cycle-1",
		Data: map[string]any{"digest": "sha256:abc", "freedBytes": 42},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion":     "1.0",
		"id":              EventID("prod", "node-1", "image", "removed", "sha256:abc/cycle-1"),
		"source":          "gcagent/prod/node-1",
		"type":            "io.gcagent.image.removed",
		"subject":         "sha256:abc",
		"time":            "2026-01-02T02:04:05.000000006Z",
		"datacontenttype": "application/json",
		"data":            map[string]any{"digest": "sha256:abc", "freedBytes": float64(42)},
	}
	if len(got) != len(want) {
		t.Errorf("fields %v, want %v", keys(got), keys(want))
	}
	for k, w := range want {
		g, _ := json.Marshal(got[k])
		ww, _ := json.Marshal(w)
		if string(g) != string(ww) {
			t.Errorf("%s = %s, want %s", k, g, ww)
		}
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestNewEventNoData(t *testing.T) {
	ev, err := NewEvent("c", "n", Action{Kind: "agent", Action: "started", Key: "boot-1"}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ev)
	if strings.Contains(string(b), `"data"`) || strings.Contains(string(b), `"subject"`) {
		t.Fatalf("empty data and subject must be omitted: %s", b)
	}
}

func TestNewEventErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    Action
	}{
		{"no kind", Action{Action: "removed", Key: "k"}},
		{"no action", Action{Kind: "image", Key: "k"}},
		{"no key", Action{Kind: "image", Action: "removed"}},
		{"data does not marshal", Action{Kind: "image", Action: "removed", Key: "k", Data: func() {}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewEvent("c", "n", tc.a, time.Now()); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}
