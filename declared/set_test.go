package declared

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func refs(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Image)
	}
	return out
}

// TestSetGraceAfterTheLastWorkload: an image stays while any workload names
// it, and for the grace after the last one stops; a workload naming it
// again within the grace ends the wait.
func TestSetGraceAfterTheLastWorkload(t *testing.T) {
	s := NewSet()
	web := Workload{Kind: "Deployment", Namespace: "shop", Name: "web"}
	old := Workload{Kind: "ReplicaSet", Namespace: "shop", Name: "web-1"}
	s.Put(web, []string{"a:2"}, t0)
	s.Put(old, []string{"a:1", "a:1"}, t0)
	if got := refs(s.Entries()); !slices.Equal(got, []string{"a:1", "a:2"}) {
		t.Fatalf("entries %v", got)
	}
	if s.Put(old, []string{"a:1"}, t0.Add(time.Second)) {
		t.Error("the same images again reported a change")
	}
	// The old ReplicaSet goes (revisionHistoryLimit): a:1 waits out the grace.
	s.Delete(old, t0.Add(time.Minute))
	if rel, next := s.Release(t0.Add(30*time.Minute), time.Hour); len(rel) != 0 || !next.Equal(t0.Add(time.Minute+time.Hour)) {
		t.Fatalf("within the grace: released %v, next %v", rel, next)
	}
	e := s.Entries()[0]
	if e.Image != "a:1" || len(e.By) != 0 || !e.Undeclared.Equal(t0.Add(time.Minute)) {
		t.Fatalf("waiting entry %+v", e)
	}
	// Named again within the grace, then dropped again: the grace starts over.
	s.Put(web, []string{"a:1", "a:2"}, t0.Add(40*time.Minute))
	s.Put(web, []string{"a:2"}, t0.Add(50*time.Minute))
	if rel, _ := s.Release(t0.Add(time.Hour+2*time.Minute), time.Hour); len(rel) != 0 {
		t.Fatalf("released %v although named again at 40m", rel)
	}
	if rel, _ := s.Release(t0.Add(time.Hour+50*time.Minute), time.Hour); !slices.Equal(rel, []string{"a:1"}) {
		t.Fatalf("after the grace: released %v, want a:1", rel)
	}
	if got := refs(s.Entries()); !slices.Equal(got, []string{"a:2"}) {
		t.Fatalf("entries after release %v", got)
	}
	if i, w := s.Len(); i != 1 || w != 1 {
		t.Errorf("Len %d images %d workloads", i, w)
	}
}

// TestSetSeedNeverShortensAGrace: a list read from the last leader seeds
// the images no workload names now with the time it recorded (none, or one
// ahead of this clock: from now); a declared image is left alone.
func TestSetSeedNeverShortensAGrace(t *testing.T) {
	s := NewSet()
	w := Workload{Kind: "Pod", Namespace: "a", Name: "p"}
	s.Put(w, []string{"x:1"}, t0)
	s.Seed("x:1", t0.Add(-2*time.Hour), t0)
	s.Seed("gone:1", t0.Add(-30*time.Minute), t0)
	s.Seed("future:1", t0.Add(time.Hour), t0) // a clock ahead: from now
	s.Seed("unknown:1", time.Time{}, t0)
	rel, _ := s.Release(t0.Add(29*time.Minute), time.Hour)
	if len(rel) != 0 {
		t.Fatalf("released %v within the grace", rel)
	}
	if rel, _ = s.Release(t0.Add(30*time.Minute), time.Hour); !slices.Equal(rel, []string{"gone:1"}) {
		t.Fatalf("released %v at 30m, want gone:1 (its recorded time)", rel)
	}
	rel, _ = s.Release(t0.Add(time.Hour), time.Hour)
	if !slices.Equal(rel, []string{"future:1", "unknown:1"}) {
		t.Fatalf("released %v", rel)
	}
	if got := refs(s.Entries()); !slices.Equal(got, []string{"x:1"}) {
		t.Fatalf("a declared image was seeded away: %v", got)
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"nginx":                      "docker.io/library/nginx:latest",
		"nginx:1.25":                 "docker.io/library/nginx:1.25",
		" registry:5000/app:v1 ":     "registry:5000/app:v1",
		"ghcr.io/org/tool":           "ghcr.io/org/tool:latest",
		"nginx@sha256:" + hex64:      "docker.io/library/nginx@sha256:" + hex64,
		"nginx:1.25@sha256:" + hex64: "docker.io/library/nginx@sha256:" + hex64,
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
		if strings.ContainsAny(got, "*?[\\") {
			t.Errorf("Normalize(%q) = %q has a glob character", in, got)
		}
	}
	for _, bad := range []string{"", "Nginx:1", "nginx:*", "a b", "nginx@sha256:short"} {
		if got, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", bad, got)
		}
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestLayoutFitsAndIsStable: 20,000 images with long names fit shards under
// the bound, each image in the shard its hash names, and a change to one
// image changes one shard only.
func TestLayoutFitsAndIsStable(t *testing.T) {
	var es []Entry
	for i := range 20_000 {
		es = append(es, Entry{Image: fmt.Sprintf("registry.example.com/team-%03d/service-with-a-long-name-%05d:v1.2.%d", i%500, i, i),
			By: []Workload{{Kind: "Deployment", Namespace: fmt.Sprintf("ns-%03d", i%500), Name: fmt.Sprintf("svc-%05d", i)},
				{Kind: "ReplicaSet", Namespace: "x", Name: "y"}, {Kind: "Pod", Namespace: "x", Name: "z"}, {Kind: "Pod", Namespace: "x", Name: "zz"}}})
	}
	shards := Layout(es, 0)
	n := len(shards)
	if n < MinShards || n&(n-1) != 0 {
		t.Fatalf("%d shards: want a power of two ≥ %d", n, MinShards)
	}
	total := 0
	for i, s := range shards {
		b, _ := json.Marshal(s)
		if len(b) > MaxShardBytes+64 {
			t.Errorf("shard %d: %d bytes", i, len(b))
		}
		for _, im := range s.Images {
			if ShardOf(im.Ref, n) != i {
				t.Fatalf("%s in shard %d, hash says %d", im.Ref, i, ShardOf(im.Ref, n))
			}
			if len(im.By) != MaxSources || im.N != 4 {
				t.Fatalf("%s: by %v n %d", im.Ref, im.By, im.N)
			}
		}
		total += len(s.Images)
	}
	if total != len(es) {
		t.Fatalf("%d images laid out, want %d", total, len(es))
	}
	t.Logf("20,000 images: %d shards", n)
	es[7].By = es[7].By[:1]
	again := Layout(es, 0)
	changed := 0
	for i := range shards {
		a, _ := json.Marshal(shards[i])
		b, _ := json.Marshal(again[i])
		if string(a) != string(b) {
			changed++
		}
	}
	if len(again) != n || changed != 1 {
		t.Errorf("one image changed: %d of %d shards changed (layout %d → %d)", changed, n, n, len(again))
	}
	if small := Layout(es[:3], 0); len(small) != MinShards {
		t.Errorf("3 images: %d shards", len(small))
	}
}

func TestKeys(t *testing.T) {
	if head, _, _, ok := ParseKey("prod", HeadKey("prod")); !ok || !head {
		t.Error("head key not parsed")
	}
	if head, n, i, ok := ParseKey("prod", ShardKey("prod", 64, 17)); !ok || head || n != 64 || i != 17 {
		t.Errorf("shard key: %v %d %d %v", head, n, i, ok)
	}
	for _, k := range []string{"declared.prod", "declared.prod.s64.64", "declared.prod.s0.0", "declared.prod.x1.0", "declared.other.head",
		"declared.prod.s64", "declared.prod.s99999.1", "clusters.prod"} {
		if _, _, _, ok := ParseKey("prod", k); ok {
			t.Errorf("ParseKey(%q) ok", k)
		}
	}
	if WatchKeys("prod") != "declared.prod.>" {
		t.Error(WatchKeys("prod"))
	}
}

// TestDecodeAndAssemble: unknown fields are ignored, unknown states and
// shards without refs are errors, and a list is whole only when its head
// is complete and every shard of its layout is held.
func TestDecodeAndAssemble(t *testing.T) {
	h, err := DecodeHead([]byte(`{"state":"complete","shards":2,"images":3,"futureField":{"x":1}}`))
	if err != nil || h.State != Complete || h.Shards != 2 {
		t.Fatalf("head %+v %v", h, err)
	}
	for _, bad := range []string{`{"state":"later"}`, `{"state":"complete","shards":-1}`, `[]`, `{`} {
		if _, err := DecodeHead([]byte(bad)); err == nil {
			t.Errorf("DecodeHead(%s) ok", bad)
		}
	}
	s0, err := DecodeShard([]byte(`{"images":[{"ref":"a:1","by":["Pod/x/y"],"n":1,"new":true}],"more":1}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{}`, `{"images":[{"n":1}]}`, `null`} {
		if _, err := DecodeShard([]byte(bad)); err == nil {
			t.Errorf("DecodeShard(%s) ok", bad)
		}
	}
	shards := map[string]Shard{ShardKey("c", 2, 0): s0, ShardKey("c", 4, 1): {Images: []ShardImage{{Ref: "old:1"}}}}
	l := Assemble("c", &h, shards)
	if l.Whole() || l.Missing != 1 || !slices.Equal(l.Patterns(), []string{"a:1"}) {
		t.Fatalf("one shard of two: whole %v missing %d patterns %v", l.Whole(), l.Missing, l.Patterns())
	}
	shards[ShardKey("c", 2, 1)] = Shard{Images: []ShardImage{{Ref: "b:1", By: []string{"CronJob/batch/r", "Job/batch/r-1"}, N: 5}}}
	l = Assemble("c", &h, shards)
	if !l.Whole() || !slices.Equal(l.Patterns(), []string{"a:1", "b:1"}) {
		t.Fatalf("whole %v patterns %v", l.Whole(), l.Patterns())
	}
	if got := l.Sources("b:1"); got != "CronJob/batch/r, Job/batch/r-1 and 3 more" {
		t.Errorf("sources %q", got)
	}
	h.State = Syncing
	if Assemble("c", &h, shards).Whole() {
		t.Error("a syncing list is whole")
	}
	if Assemble("c", nil, shards).Whole() {
		t.Error("no head is whole")
	}
}
