package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/tracegen"
	"github.com/gcagent/gcagent/trace"
)

// declaredNode is smallBusyNode with CronJobs, scale-to-zero workloads
// and rollbacks beside the busy mix.
func declaredNode() tracegen.Params {
	p := smallBusyNode()
	p.Declared = tracegen.Workloads{CronJobs: 6, ScaleToZero: 6, Rollbacks: 4}
	return p
}

// clusterList is tracegen's keep list as the cluster's references.
func clusterList(p tracegen.Params) KeepList {
	k := KeepList{Declared: map[string]string{}, Sources: []string{"tracegen"}}
	for _, e := range tracegen.KeepList(p) {
		k.Declared[e.Image] = e.By[0].String()
	}
	return k
}

// TestReplayKeepListSavesDeclaredRepulls (issue 41 item 6): on a
// generated trace with CronJobs, scale-to-zero workloads and rollbacks,
// the keep list those workloads declare re-pulls fewer of their images
// than plain LRU (none: a kept image is never deleted), and every figure
// is what the two replays compute: the side without the list is the
// plain replay, the kept images' re-pulls are counted from each side's
// deletions, and the saving is the difference.
func TestReplayKeepListSavesDeclaredRepulls(t *testing.T) {
	p := declaredNode()
	recs := tracegen.Generate(p)
	keep := clusterList(p)
	res := CompareKeep(recs, Options{Detail: true}, keep)
	t.Logf("kept %d images (%d bytes); their re-pulls: %d (%d bytes, %s) without the list, %d with; all re-pulls %d -> %d, mean free %.2f%% -> %.2f%%",
		res.Kept.Images, res.Kept.Bytes, res.Kept.Without.Repulls, res.Kept.Without.RepulledBytes, res.Kept.Without.RepullTime,
		res.Kept.With.Repulls, res.Without.Repulls, res.Replayed.Repulls, res.Without.MeanFree, res.Replayed.MeanFree)

	if res.Kept.Images != len(keep.Declared) {
		t.Errorf("the list keeps %d images of the trace, want its %d", res.Kept.Images, len(keep.Declared))
	}
	if res.Kept.Without.Repulls == 0 {
		t.Fatal("plain LRU re-pulls none of the declared images: the trace does not show what a keep list saves")
	}
	if res.Kept.With.Repulls >= res.Kept.Without.Repulls || res.Kept.With.Repulls != 0 {
		t.Errorf("with the keep list %d re-pulls of its images, without %d: want fewer, none", res.Kept.With.Repulls, res.Kept.Without.Repulls)
	}

	plain := Simulate(recs, Options{Detail: true})
	with := Simulate(recs, Options{Detail: true, Policy: override(func(pol *gc.ImagePolicy) {
		pol.FleetKeep = gc.KeepList{Input: gc.Input{State: gc.InputKnown}, Declared: keep.Declared}
	})})
	if !reflect.DeepEqual(res.Without, plain.Replayed) {
		t.Errorf("without the keep list: %+v\nthe plain replay: %+v", short(res.Without), short(plain.Replayed))
	}
	if !reflect.DeepEqual(res.Replayed, with.Replayed) || !reflect.DeepEqual(res.Recorded, plain.Recorded) {
		t.Errorf("with the keep list: %+v\nits own replay: %+v", short(res.Replayed), short(with.Replayed))
	}
	digests := map[string]bool{}
	for _, r := range recs {
		if r.Ev == trace.KindImage && slices.ContainsFunc(r.Names, func(n string) bool { _, ok := keep.Declared[n]; return ok }) {
			digests[r.Digest] = true
		}
	}
	count := func(dels []Deletion) (n int, b int64) {
		for _, d := range dels {
			if digests[d.Digest] && !d.Returned.IsZero() {
				n, b = n+1, b+d.Size
			}
		}
		return n, b
	}
	if n, b := count(plain.Replayed.Deleted); n != res.Kept.Without.Repulls || b != res.Kept.Without.RepulledBytes {
		t.Errorf("kept images' re-pulls without the list: %+v, counted %d (%d bytes)", res.Kept.Without, n, b)
	}
	if res.Kept.Without.RepullTime <= time.Duration(res.Kept.Without.Repulls)*DefaultPullCost().Fixed {
		t.Errorf("kept images' re-pull time %s for %d re-pulls: want more than the fixed cost each", res.Kept.Without.RepullTime, res.Kept.Without.Repulls)
	}
	s := res.Saved
	if s.Repulls != plain.Replayed.Repulls-with.Replayed.Repulls || s.RepulledBytes != plain.Replayed.RepulledBytes-with.Replayed.RepulledBytes ||
		s.RepullTime != plain.Replayed.RepullTime-with.Replayed.RepullTime || s.MeanFreePoints != with.Replayed.MeanFree-plain.Replayed.MeanFree {
		t.Errorf("saved %+v: not the difference of the replays", s)
	}
	if s.MeanFreePoints > 0 {
		t.Errorf("keeping more images left more of the disk free on average (%+.2f points)", s.MeanFreePoints)
	}
}

// short is an Outcome without its deletions, for messages.
func short(o Outcome) Outcome { o.Deleted = nil; return o }

// TestParseKeepList: a file of patterns, one a line with # comments, or
// the JSON of ctl keep ls (the all-clusters list, the cluster's own and
// the cluster keep list count; other clusters' are said to be left out);
// bad input is an error naming the file and line.
func TestParseKeepList(t *testing.T) {
	k, err := ParseKeepList("keep.txt", []byte("# batch jobs\nregistry.example/batch/*\n\n  nginx:1.25\nregistry.example/batch/*\n"), "prod")
	if err != nil || !slices.Equal(k.Patterns, []string{"registry.example/batch/*", "nginx:1.25"}) || len(k.Declared) != 0 {
		t.Fatalf("%+v %v", k, err)
	}
	if !k.covers([]string{"docker.io/library/nginx:1.25"}) || k.covers([]string{"registry.example/batch/a/b:1"}) {
		t.Errorf("patterns keep as --keep-image's")
	}
	for in, want := range map[string]string{
		"a:1\n[x\n":                            "keep.txt:2:",
		"a:1 b:1\n":                            "keep.txt:1:",
		"# nothing\n":                          "holds no pattern",
		`{"*": {"patterns": "x"}}`:             "want an object with patterns",
		`{"prod": {"patterns": ["[x"]}}`:       `list "prod"`,
		`{"declared": {"images": [{"n": 1}]}}`: "without ref",
		`{"other": {"patterns": ["a:1"]}}`:     "holds no pattern for cluster prod",
		`{not json`:                            "not the JSON",
	} {
		if _, err := ParseKeepList("keep.txt", []byte(in), "prod"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", in, err, want)
		}
	}

	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ls := map[string]any{
		"*":     map[string]any{"patterns": []string{"base.example/*"}, "updatedAt": now},
		"prod":  map[string]any{"patterns": []string{"registry.example/app:*"}},
		"other": map[string]any{"patterns": []string{"elsewhere.example/*"}},
		"declared": map[string]any{"head": declared.Head{State: declared.Syncing, Shards: 16, Heartbeat: now},
			"missingShards": 0, "images": []declared.ShardImage{{Ref: "registry.example/batch/report:v1", By: []string{"CronJob/batch/report"}, N: 1}}},
	}
	b, _ := json.Marshal(ls)
	k, err = ParseKeepList("ls.json", b, "prod")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(k.Patterns, []string{"base.example/*", "registry.example/app:*"}) || k.Declared["registry.example/batch/report:v1"] != "CronJob/batch/report" {
		t.Errorf("%+v", k)
	}
	notes := strings.Join(k.Notes, "\n")
	if !strings.Contains(notes, "clusters other") || !strings.Contains(notes, "syncing") {
		t.Errorf("notes %q: want the other cluster left out and the list syncing", notes)
	}
	if !k.covers([]string{"registry.example/batch/report:v1"}) || k.covers([]string{"elsewhere.example/x:1"}) {
		t.Errorf("covers: the cluster's reference by name, not another cluster's pattern")
	}
}

// TestCommandKeepList: replay with a keep list prints the replay without
// it and with it side by side, what it saves and costs, as --json says.
func TestCommandKeepList(t *testing.T) {
	p := declaredNode()
	path := writeTrace(t, tracegen.Generate(p), "")
	keep := clusterList(p)
	run := func(asJSON bool) string {
		var out, errOut bytes.Buffer
		err := Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, KeepList: &keep, JSON: asJSON}, &out, &errOut)
		if err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	text := run(false)
	t.Logf("\n%s", text)
	var res KeepResult
	if err := json.Unmarshal([]byte(run(true)), &res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"recorded  without keep list  with keep list",
		fmt.Sprintf("keep list: 0 patterns and %d references from tracegen", len(keep.Declared)),
		fmt.Sprintf("saved: %d re-pulls, %s", res.Saved.Repulls, gc.HumanBytes(res.Saved.RepulledBytes)),
		fmt.Sprintf("the kept images: %d re-pulls (%s", res.Kept.Without.Repulls, gc.HumanBytes(res.Kept.Without.RepulledBytes)),
		fmt.Sprintf("the others: %d re-pulls", res.Without.Repulls-res.Kept.Without.Repulls),
		fmt.Sprintf("mean free %.1f%% -> %.1f%%", res.Without.MeanFree, res.Replayed.MeanFree),
		"pull time: 1s + size / 32.0 MiB/s",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if res.Kept.Without.Repulls == 0 || res.Recorded.Deletions == 0 || res.Replayed.Deleted != nil {
		t.Errorf("json: %+v", res.Kept)
	}
	for _, o := range []CommandOptions{
		{Source: trace.Source{File: path}, KeepList: &KeepList{Sources: []string{"x"}}},
		{Source: trace.Source{File: path}, KeepList: &keep, Sweep: FlagHigh + "=80..90:5"},
		{Source: trace.Source{File: path}, PullCost: PullCost{Fixed: time.Second, Throughput: -1}},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: valid", o)
		}
	}
}
