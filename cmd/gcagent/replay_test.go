package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/tracegen"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/replay"
	"github.com/gcagent/gcagent/trace"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestReplayCommand: a bad --order, --sweep or trace verb is a usage
// error of one line; trace export of a file writes it back with its
// header; replay prints the policy given beside the recorded one.
func TestReplayCommand(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--order", "fifo"},
		{"replay", "--sweep", "image-gc-high-threshold=95..90"},
		{"replay", "--sweep", "keep-image=a..b"},
		{"replay", "--json=maybe"},
		{"replay", "--trace"},
		{"trace"},
		{"trace", "import"},
	} {
		err := execute(context.Background(), args, nil, io.Discard, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a usage error of one line", args, err)
		}
	}
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	recs := []trace.Record{
		{T: t0, Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80}},
		{T: t0, Ev: trace.KindImage, NS: "k8s.io", Digest: "sha256:a", Names: []string{"a:1"}, Size: 100},
		{T: t0.Add(time.Second), Ev: trace.KindImage, NS: "k8s.io", Digest: "sha256:b", Names: []string{"b:1"}, Size: 100},
		{T: t0.Add(time.Minute), Ev: trace.KindDisk, Disk: &trace.Disk{Capacity: 1000, Available: 180}},
	}
	var buf bytes.Buffer
	if err := trace.Export(&buf, trace.Record{Node: "n1"}, recs); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	var out strings.Builder
	if err := execute(context.Background(), []string{"trace", "export", "--trace", file, "--state-dir", state}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if out.String() != buf.String() {
		t.Errorf("export of a file:\n%s\nwant:\n%s", out.String(), buf.String())
	}
	out.Reset()
	err := execute(context.Background(), []string{"replay", "--trace", file, "--state-dir", state, "--image-gc-high-threshold", "81",
		"--image-gc-low-threshold", "70"}, nil, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// 82% on a 1000-byte disk: at 81/70 both images go (the older first).
	for _, want := range []string{"replayed: high 81%, low 70%", "deletions            0         2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("replay output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestReplayKeepListFromNATS (issue 41 item 6): replay --keep-list-nats
// reads the fleet keep list an agent of --cluster merges (the
// all-clusters key, the cluster's key, the cluster keep list
// gcagent-cluster writes) and replays with it beside the same replay
// without it; --keep-list adds a file's patterns. No bucket, or a pattern
// the agent would take as invalid, is an error; a bad file, a keep list
// with --sweep or a throughput of 0 a usage error.
func TestReplayKeepListFromNATS(t *testing.T) {
	p := tracegen.Params{Days: 2, Images: 300, Runs: 8000, Capacity: 150 << 30, Other: 15 << 30, Warmup: 12 * time.Hour,
		Declared: tracegen.Workloads{CronJobs: 3, ScaleToZero: 3, Rollbacks: 2}}
	recs := tracegen.Generate(p)
	var buf bytes.Buffer
	if err := trace.Export(&buf, trace.Record{Node: "n1"}, recs); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startTestNATS(t)
	url := "--nats-url=" + s.ClientURL()
	base := []string{"replay", "--trace", file, "--state-dir", t.TempDir(), url, "--cluster", "prod"}
	replayJSON := func(args ...string) (replay.KeepResult, error) {
		out, _, err := runCLI(context.Background(), nil, append(append(slices.Clone(base), "--json"), args...)...)
		var res replay.KeepResult
		if err == nil {
			err = json.Unmarshal([]byte(out), &res)
		}
		return res, err
	}
	var ue usageError
	if _, err := replayJSON("--keep-list-nats"); err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "no fleet keep list on") {
		t.Fatalf("no bucket: %v", err)
	}

	// The operator keeps the CronJobs' repository by a glob; the cluster
	// keep list holds the other workloads' references.
	if out, errOut, err := runCLI(context.Background(), nil, "ctl", "keep", "add", "registry.example/batch/*", "--cluster", "prod", url); err != nil {
		t.Fatalf("ctl keep add: %v\n%s%s", err, out, errOut)
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, natsbus.KeepBucket)
	if err != nil {
		t.Fatal(err)
	}
	var entries []declared.Entry
	for _, e := range tracegen.KeepList(p) {
		if !strings.Contains(e.Image, "/batch/") {
			entries = append(entries, e)
		}
	}
	shards := declared.Layout(entries, 0)
	for i, sh := range shards {
		b, _ := json.Marshal(sh)
		if _, err := kv.Put(ctx, declared.ShardKey("prod", len(shards), i), b); err != nil {
			t.Fatal(err)
		}
	}
	head, _ := json.Marshal(declared.Head{State: declared.Complete, Shards: len(shards), Images: len(entries), Workloads: 5,
		Heartbeat: time.Now(), HeartbeatEveryS: 10, By: "gcagent-cluster-0"})
	if _, err := kv.Put(ctx, declared.HeadKey("prod"), head); err != nil {
		t.Fatal(err)
	}

	res, err := replayJSON("--keep-list-nats")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("keep list %+v; kept %+v", res.KeepList, res.Kept)
	if !slices.Equal(res.KeepList.Patterns, []string{"registry.example/batch/*"}) || res.KeepList.References != len(entries) ||
		res.Kept.Images != len(tracegen.KeepList(p)) {
		t.Errorf("keep list %+v, %d images kept: want the cluster's glob, its %d references, all %d declared images",
			res.KeepList, res.Kept.Images, len(entries), len(tracegen.KeepList(p)))
	}
	if src := strings.Join(res.KeepList.Sources, "; "); !strings.Contains(src, "key clusters.prod (1 patterns)") || !strings.Contains(src, "cluster keep list of prod (complete, 7 references)") {
		t.Errorf("sources %q", src)
	}
	if res.Kept.Without.Repulls == 0 || res.Kept.With.Repulls >= res.Kept.Without.Repulls {
		t.Errorf("kept images' re-pulls: %d without the list, %d with it", res.Kept.Without.Repulls, res.Kept.With.Repulls)
	}
	out, _, err := runCLI(context.Background(), nil, append(slices.Clone(base), "--keep-list-nats")...)
	if err != nil || !strings.Contains(out, "without keep list  with keep list") || !strings.Contains(out, "saved: ") {
		t.Errorf("text: %v\n%s", err, out)
	}

	// A file's patterns are added once.
	keepFile := filepath.Join(dir, "keep.txt")
	if err := os.WriteFile(keepFile, []byte("# the CronJobs again, and one more\nregistry.example/batch/*\nregistry.example/team-1/*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := replayJSON("--keep-list-nats", "--keep-list", keepFile); err != nil ||
		!slices.Equal(res.KeepList.Patterns, []string{"registry.example/batch/*", "registry.example/team-1/*"}) {
		t.Errorf("file and NATS: %v %+v", err, res.KeepList)
	}

	// An invalid pattern in a key the agent reads.
	if _, err := kv.Put(ctx, natsbus.KeepAllKey, []byte(`{"patterns": ["registry.example/[x"]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := replayJSON("--keep-list-nats"); err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "key all") {
		t.Errorf("invalid pattern: %v", err)
	}

	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("ok:1\n[x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--keep-list", filepath.Join(dir, "missing.txt")},
		{"--keep-list", bad},
		{"--keep-list", keepFile, "--sweep", "image-gc-high-threshold=80..90:5"},
		{"--pull-throughput", "0"},
		{"--pull-near", "[x"},
	} {
		if _, err := replayJSON(args...); !errors.As(err, &ue) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a usage error of one line", args, err)
		}
	}
}
