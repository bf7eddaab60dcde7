package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/trace"
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
