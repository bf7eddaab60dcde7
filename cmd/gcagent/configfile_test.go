package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/trace"
)

// confFile writes content as a config file and returns its path.
func confFile(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "gcagent.conf")
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestConfigFileRepeatedKey: a repeatable setting takes every line of the
// file (two keep-image lines keep both patterns); a scalar one given twice
// is refused with status 2, naming the file and both lines, whichever value
// comes first. On d7dd547 the second keep-image line was dropped, and 91
// then 88 gave 91 without a word.
func TestConfigFileRepeatedKey(t *testing.T) {
	keep := confFile(t, "keep-image = registry.test/*\n# the second pattern\nkeep-image = other.test/app:*\n")
	cfg, err := parseRun([]string{"--config", keep}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.KeepImages, []string{"registry.test/*", "other.test/app:*"}) || cfg.Sources["keep-image"] != "file "+keep+":1,3" {
		t.Errorf("keep-image %q from %q, want both lines (file %s:1,3)", cfg.KeepImages, cfg.Sources["keep-image"], keep)
	}
	// A variable still wins over every line of the file.
	cfg, err = parseRun([]string{"--config", keep}, map[string]string{"GCAGENT_KEEP_IMAGE": "env.test/*"})
	if err != nil || !slices.Equal(cfg.KeepImages, []string{"env.test/*"}) {
		t.Errorf("with GCAGENT_KEEP_IMAGE: %q %v, want the variable's only", cfg.KeepImages, err)
	}

	for _, content := range []string{
		"image-gc-high-threshold = 91\nimage-gc-high-threshold = 88\n",
		"prune-containers = off\n\nprune-containers = all\n",
	} {
		file := confFile(t, content)
		_, err := parseRun([]string{"--config", file}, nil)
		var ue usageError
		if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), file+":") || !strings.Contains(err.Error(), "is set again (first on line 1)") {
			t.Errorf("%q: %v, want a usage error naming %s and the first line", content, err, file)
		}
	}
	// Also when a flag gives the setting: the file is wrong either way.
	file := confFile(t, "image-gc-high-threshold = 91\nimage-gc-high-threshold = 88\n")
	if _, err := parseRun([]string{"--config", file, "--image-gc-high-threshold=90"}, nil); err == nil {
		t.Error("a repeated scalar line is accepted when a flag gives it")
	}
}

// TestConfigFileErrorsNameTheLine: every error about the file starts with
// PATH: or PATH:LINE:, also a value the policy refuses (which d7dd547 gave
// as `invalid --image-gc-high-threshold 150`, naming no file); a value in
// quotes is taken without them, a stray quote is refused.
func TestConfigFileErrorsNameTheLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.conf")
	for _, tc := range []struct{ content, want string }{
		{"image-gc-high-threshold = 150\n", ":1: invalid --image-gc-high-threshold 150: must be between 0 and 100"},
		{"# x\nimage-gc-low-threshold = 90\n", ":2: invalid --image-gc-low-threshold 90: must not exceed --image-gc-high-threshold 85"},
		{"image-gc-high-threshold = 70\n", ":1: invalid --image-gc-high-threshold 70: below --image-gc-low-threshold 80 (default); give --image-gc-low-threshold too, e.g. 65"},
		{"pod-log-grace = 5\n", `:1: invalid value "5" for --pod-log-grace`},
		{"no equals sign\n", ":1: want name = value"},
		{"image-gc-high-threshold = \"90\n", `:1: image-gc-high-threshold: value "90 has an unmatched quote`},
		{"image-gc-high-treshold = 90\n", `:1: unknown setting "image-gc-high-treshold"`},
	} {
		file := confFile(t, tc.content)
		_, err := parseRun([]string{"--config", file}, nil)
		if err == nil || !strings.HasPrefix(err.Error(), file+tc.want) {
			t.Errorf("%q: %v, want %q", tc.content, err, file+tc.want)
		}
	}
	_, err := parseRun([]string{"--config", missing}, nil)
	if want := missing + ": cannot read the config file (--config): no such file or directory"; err == nil || err.Error() != want {
		t.Errorf("missing file: %v, want %q", err, want)
	}
	_, err = parseRun(nil, map[string]string{"GCAGENT_IMAGE_GC_HIGH_THRESHOLD": "150"})
	if err == nil || !strings.HasPrefix(err.Error(), "GCAGENT_IMAGE_GC_HIGH_THRESHOLD: invalid --image-gc-high-threshold 150") {
		t.Errorf("a variable's bad value: %v, want it named first", err)
	}
	cfg, err := parseRun([]string{"--config", confFile(t, "image-gc-high-threshold = \"90\"\nimage-gc-low-threshold = '70'\n")}, nil)
	if err != nil || cfg.ImageGCHighThreshold != 90 || cfg.ImageGCLowThreshold != 70 {
		t.Errorf("quoted values: %d/%d %v, want 90/70", cfg.ImageGCHighThreshold, cfg.ImageGCLowThreshold, err)
	}
}

// fakeAgent serves a /plan of an agent on containerd addr with state dir
// dir at a free loopback port, and records the queries it gets.
func fakeAgent(t *testing.T, addr, dir string) (string, *[]url.Values) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var queries []url.Values
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Query())
		_ = json.NewEncoder(w).Encode(agent.Plan{At: time.Now(), Containerd: addr, StateDir: dir, History: "agent",
			HistoryNote: "the fake agent's own projection"})
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), &queries
}

// TestPlanWhatIfOfTheHighThresholdAlone: the README's what-if, `plan
// --image-gc-high-threshold=70`, is asked of the running agent with the
// high threshold only (the agent's own low one follows it down), where
// d7dd547 exited 2 on a default low threshold of 80 the user never set;
// run still refuses the pair, naming the default and the fix.
func TestPlanWhatIfOfTheHighThresholdAlone(t *testing.T) {
	addr, queries := fakeAgent(t, "/run/containerd/containerd.sock", "/var/lib/gcagent")
	out, _, err := runCLI(context.Background(), nil, "plan", "--image-gc-high-threshold=70", "--metrics-address", addr)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	if len(*queries) != 1 || (*queries)[0].Get("image-gc-high-threshold") != "70" || (*queries)[0].Has("image-gc-low-threshold") {
		t.Errorf("asked the agent %v, want the high threshold 70 alone", *queries)
	}
	if !strings.Contains(out, "the fake agent's own projection") {
		t.Errorf("plan printed:\n%s", out)
	}
	_, err = parseRun([]string{"--image-gc-high-threshold=70"}, nil)
	if want := "invalid --image-gc-high-threshold 70: below --image-gc-low-threshold 80 (default); give --image-gc-low-threshold too, e.g. 65"; err == nil || err.Error() != want {
		t.Errorf("run: %v, want %q", err, want)
	}
	cfg := agent.DefaultConfig()
	cfg.ImageGCHighThreshold, cfg.Sources = 70, map[string]string{"image-gc-high-threshold": "flag"}
	if moved := cfg.FollowHigh(); cfg.ImageGCLowThreshold != 65 || !strings.Contains(moved, "80% (default) exceeds --image-gc-high-threshold 70%: planned with 65%") ||
		!strings.HasPrefix(cfg.Sources["image-gc-low-threshold"], agent.MovedSource) {
		t.Errorf("FollowHigh: low %d, %q, source %q", cfg.ImageGCLowThreshold, moved, cfg.Sources["image-gc-low-threshold"])
	}
}

// TestPlanElsewhereIsPlannedHere: given another --containerd-address or
// --state-dir than those of the agent answering at --metrics-address, plan
// does not print that agent's plan (d7dd547 did, exit 0, with no word that
// they were ignored): it plans from those given, here a containerd that
// does not answer, so it fails naming it.
func TestPlanElsewhereIsPlannedHere(t *testing.T) {
	addr, _ := fakeAgent(t, "/run/containerd/containerd.sock", "/var/lib/gcagent")
	sock := filepath.Join(t.TempDir(), "other.sock")
	for _, args := range [][]string{
		{"--containerd-address", sock},
		{"--containerd-address", "unix://" + sock, "--state-dir", t.TempDir()},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, _, err := runCLI(ctx, nil, append([]string{"plan", "--metrics-address", addr}, args...)...)
		cancel()
		if err == nil || !strings.Contains(err.Error(), sock) || strings.Contains(out, "fake agent") {
			t.Errorf("%v: %v, printed %q; want an error naming %s and not the agent's plan", args, err, out, sock)
		}
	}
	// The same containerd, as given in the agent's pod: the agent's plan.
	out, _, err := runCLI(context.Background(), nil, "plan", "--metrics-address", addr, "--containerd-address", "/run/containerd//containerd.sock")
	if err != nil || !strings.Contains(out, "fake agent") {
		t.Errorf("the agent's own containerd: %v\n%s", err, out)
	}
}

// TestReplayHighThresholdAlone: `replay --image-gc-high-threshold=70` (the
// default low threshold 80 exceeds it) replays the recorded low one moved
// down with it, where d7dd547 exited 2.
func TestReplayHighThresholdAlone(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	var buf bytes.Buffer
	if err := trace.Export(&buf, trace.Record{Node: "n1"}, []trace.Record{
		{T: t0, Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80}},
		{T: t0, Ev: trace.KindImage, NS: "k8s.io", Digest: "sha256:a", Names: []string{"a:1"}, Size: 100},
		{T: t0.Add(time.Minute), Ev: trace.KindDisk, Disk: &trace.Disk{Capacity: 1000, Available: 180}},
	}); err != nil {
		t.Fatal(err)
	}
	file := confFile(t, buf.String())
	out, _, err := runCLI(context.Background(), nil, "replay", "--trace", file, "--state-dir", t.TempDir(), "--image-gc-high-threshold=70")
	if err != nil || !strings.Contains(out, "high 70%, low 65%") {
		t.Errorf("replay: %v\n%s", err, out)
	}
}

// TestToolsReadRunsConfigFile: status and watch read the settings of
// their areas from run's config file (GCAGENT_CONFIG, as set for the
// agent), as they read GCAGENT_<FLAG>: on d7dd547 status asked the default
// address while the file gave the agent another, and watch ignored the
// file's state dir.
func TestToolsReadRunsConfigFile(t *testing.T) {
	dir := t.TempDir()
	// Run's file as a node has it: a repeatable key twice is fine for a
	// tool that does not take it too.
	file := confFile(t, "metrics-address = 127.0.0.1:1\nstate-dir = "+dir+"\nimage-gc-high-threshold = 90\nkeep-image = a/*\nkeep-image = b/*\n")
	_, _, err := runCLI(context.Background(), map[string]string{"GCAGENT_CONFIG": file}, "status")
	if err == nil || !strings.Contains(err.Error(), "no agent at 127.0.0.1:1") {
		t.Errorf("status: %v, want it to ask the file's 127.0.0.1:1", err)
	}
	_, _, err = runCLI(context.Background(), nil, "watch", "--config", file, "--once")
	if err == nil || !strings.Contains(err.Error(), "--state-dir "+dir) {
		t.Errorf("watch: %v, want it to look in the file's state dir %s", err, dir)
	}
}
