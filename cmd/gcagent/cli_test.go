package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/agent"
)

// environOf is env as KEY=value lines, sorted.
func environOf(env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// parseRun parses `gcagent run ARGS` with the environment env as the
// binary does, and returns the config the agent would start with.
func parseRun(args []string, env map[string]string) (agent.Config, error) {
	var got agent.Config
	environ := environOf(env)
	c := &cli{environ: environ, env: lookupIn(environ), stdout: io.Discard, stderr: io.Discard,
		runAgent: func(_ context.Context, cfg agent.Config, _ io.Writer) error { got = cfg; return nil }}
	err := c.execute(context.Background(), append([]string{"run"}, args...))
	return got, err
}

// runCLI runs the command line args with env in process and returns what
// it printed.
func runCLI(ctx context.Context, env map[string]string, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = execute(ctx, args, environOf(env), &out, &errOut)
	return out.String(), errOut.String(), err
}

var update = flag.Bool("update", false, "rewrite the golden help files in testdata/help")

// helpCommands are the commands whose help is golden, by file name.
var helpCommands = map[string][]string{
	"gcagent": nil, "run": {"run"}, "plan": {"plan"}, "check": {"check"}, "status": {"status"},
	"watch": {"watch"}, "ctl": {"ctl"}, "ctl-keep": {"ctl", "keep"}, "version": {"version"},
	"replay": {"replay"}, "trace-export": {"trace", "export"},
}

// TestHelpGolden: every command's help, as -h, --help and `gcagent help`
// print it on standard output with exit status 0, is its golden file
// (go test -run TestHelpGolden -update rewrites them). The helpers check
// what every help must show: the command's own flags (plan's and check's
// --json) and the areas of run's flags it takes, and nothing of another
// command.
func TestHelpGolden(t *testing.T) {
	for name, path := range helpCommands {
		t.Run(name, func(t *testing.T) {
			out, errOut, err := runCLI(context.Background(), nil, append(slices.Clone(path), "-h")...)
			if err != nil || errOut != "" {
				t.Fatalf("-h: %v, stderr %q", err, errOut)
			}
			for _, alt := range [][]string{append(slices.Clone(path), "--help"), append([]string{"help"}, path...)} {
				if o, _, err := runCLI(context.Background(), nil, alt...); err != nil || o != out {
					t.Errorf("%v: %v, printed another help than -h:\n%s", alt, err, o)
				}
			}
			file := filepath.Join("testdata", "help", name+".txt")
			if *update {
				if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("help differs from %s (go test -run TestHelpGolden -update):\n%s", file, out)
			}
		})
	}
	help := func(path ...string) string {
		out, _, _ := runCLI(context.Background(), nil, append(path, "-h")...)
		return out
	}
	for _, tc := range []struct {
		path          []string
		shows, hidden []string
	}{
		{[]string{"plan"}, []string{"\nFlags:\n      --json", "Image GC flags:", "--image-gc-high-threshold percent", "--metrics-address"},
			[]string{"--nats-url", "--profiling", "--since"}},
		{[]string{"check"}, []string{"\nFlags:\n      --json", "Image GC flags:", "NATS flags:", "--nats-url"}, []string{"--since", "--all-clusters"}},
		{[]string{"run"}, []string{"General flags:", "Image GC flags:", "Container GC flags:", "Log cleanup flags:",
			"containerd flags:", "State flags:", "NATS flags:", "Embedded NATS flags:", "Endpoint flags:"}, []string{"--json"}},
		{[]string{"status"}, []string{"--json", "--metrics-address"}, []string{"--address", "--nats-url"}},
		{[]string{"ctl", "keep"}, []string{"--all-clusters", "--state-dir", "--nats-url"}, []string{"--node ", "--image "}},
		{[]string{"version"}, []string{"Usage:\n  gcagent version"}, []string{"commit unknown"}},
	} {
		out := help(tc.path...)
		for _, s := range tc.shows {
			if !strings.Contains(out, s) {
				t.Errorf("%v -h lacks %q", tc.path, s)
			}
		}
		for _, s := range tc.hidden {
			if strings.Contains(out, s) {
				t.Errorf("%v -h shows %q", tc.path, s)
			}
		}
	}
}

// TestFlagsEitherSide: flags go before or after a verb alike. With an
// empty state dir, ctl, ctl keep and watch fail at once naming that dir,
// which only the flag (or GCAGENT_STATE_DIR) can have given them.
func TestFlagsEitherSide(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"ctl", "status", "--state-dir", dir}, {"ctl", "--state-dir", dir, "status"}, {"ctl", "--state-dir=" + dir, "--json", "status"},
		{"ctl", "keep", "ls", "--state-dir", dir}, {"ctl", "keep", "--state-dir", dir, "ls"}, {"ctl", "--state-dir", dir, "keep", "ls"},
		{"ctl", "keep", "add", "app:*", "--state-dir", dir, "--all-clusters"}, {"ctl", "keep", "--all-clusters", "--state-dir", dir, "add", "app:*"},
		{"watch", "--state-dir", dir, "--json"},
	} {
		_, _, err := runCLI(context.Background(), nil, args...)
		if err == nil || !strings.Contains(err.Error(), "no agent listens for local tools with --state-dir "+dir) {
			t.Errorf("%v: %v, want it to look for an agent in %s", args, err, dir)
		}
	}
	// And from the environment, as the agent reads it.
	for _, args := range [][]string{{"ctl", "status"}, {"ctl", "--json", "plan"}, {"ctl", "keep", "ls"}, {"watch"}} {
		_, _, err := runCLI(context.Background(), map[string]string{"GCAGENT_STATE_DIR": dir}, args...)
		if err == nil || !strings.Contains(err.Error(), "no agent listens for local tools with --state-dir "+dir) {
			t.Errorf("GCAGENT_STATE_DIR %v: %v, want it to look for an agent in %s", args, err, dir)
		}
	}
}

// TestUsageErrorsSuggest: a mistyped command, verb, flag, config key or
// variable is a usage error (exit status 2) of one line that suggests the
// nearest known name, found locally: nothing is sent to the nodes (the
// state dir names no agent, so anything sent would fail otherwise).
func TestUsageErrorsSuggest(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gcagent.conf")
	if err := os.WriteFile(file, []byte("image-gc-high-treshold = 90\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"pln"}, nil, `unknown command "pln" for gcagent (did you mean plan?)`},
		{[]string{"frobnicate"}, nil, `unknown command "frobnicate" for gcagent (gcagent -h lists them)`},
		{[]string{"ctl", "stauts", "--state-dir", dir}, nil, `ctl: unknown verb "stauts" (did you mean status?)`},
		{[]string{"ctl", "--state-dir", dir}, nil, "ctl: want a verb (status, plan, explain, gc) or keep"},
		{[]string{"ctl", "keep", "lst", "--state-dir", dir}, nil, `ctl keep: unknown verb "lst" (did you mean ls?)`},
		{[]string{"run", "--image-gc-hight-threshold=90"}, nil, "run: unknown flag --image-gc-hight-threshold (did you mean --image-gc-high-threshold?)"},
		{[]string{"run", "-image-gc-high-threshold=90"}, nil, "run: unknown flag -image-gc-high-threshold=90 (flags take two dashes: --image-gc-high-threshold)"},
		{[]string{"plan", "--jsn"}, nil, "plan: unknown flag --jsn (did you mean --json?)"},
		{[]string{"ctl", "--all-clusters", "keep", "add", "x"}, nil, "ctl: unknown flag --all-clusters (a flag of ctl keep)"},
		{[]string{"status", "--nats-url=x"}, nil, "status: unknown flag --nats-url (a flag of check, ctl, ctl keep, replay, run, watch)"},
		{[]string{"run", "--config", file}, nil, file + `:1: unknown setting "image-gc-high-treshold" (did you mean image-gc-high-threshold?)`},
		{[]string{"run"}, map[string]string{"GCAGENT_IMAGE_GC_HIGHTHRESHOLD": "90"}, "unknown environment variable GCAGENT_IMAGE_GC_HIGHTHRESHOLD (did you mean GCAGENT_IMAGE_GC_HIGH_THRESHOLD?)"},
		{[]string{"run", "--image-gc-high-threshold=eighty"}, nil, `run: invalid argument "eighty" for "--image-gc-high-threshold" flag: want a whole percent from 0 to 100, e.g. 85 or 85%`},
		{[]string{"watch", "--since=5"}, nil, `watch: invalid argument "5" for "--since" flag: want a duration with a unit, e.g. 90s, 5m or 2h`},
		{[]string{"version", "now"}, nil, `version: unexpected argument "now"`},
		{nil, nil, "no command given (gcagent -h lists them)"},
	} {
		out, errOut, err := runCLI(context.Background(), tc.env, tc.args...)
		var ue usageError
		if !errors.As(err, &ue) || exitCode(err) != 2 {
			t.Errorf("%v: %v, want a usage error (exit status 2)", tc.args, err)
			continue
		}
		if err.Error() != tc.want || out != "" || errOut != "" {
			t.Errorf("%v:\n got %q (stdout %q, stderr %q)\nwant %q", tc.args, err, out, errOut, tc.want)
		}
	}
}

// TestAddressFlag: every command names the agent's address --metrics-address
// (status too, from GCAGENT_METRICS_ADDRESS as the agent reads it);
// status's old --address still works and says it is deprecated.
func TestAddressFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there: the error names the address asked
	for _, tc := range []struct {
		args       []string
		env        map[string]string
		deprecated bool
	}{
		{[]string{"status", "--metrics-address", addr}, nil, false},
		{[]string{"status"}, map[string]string{"GCAGENT_METRICS_ADDRESS": addr}, false},
		{[]string{"status", "--address", addr}, map[string]string{"GCAGENT_METRICS_ADDRESS": "127.0.0.1:1"}, true},
	} {
		_, errOut, err := runCLI(context.Background(), tc.env, tc.args...)
		if err == nil || !strings.Contains(err.Error(), "agent at "+addr) {
			t.Errorf("%v %v: %v, want it to ask %s", tc.args, tc.env, err, addr)
		}
		if got := strings.Contains(errOut, "--address is deprecated, use --metrics-address"); got != tc.deprecated {
			t.Errorf("%v: stderr %q, deprecation said %v, want %v", tc.args, errOut, got, tc.deprecated)
		}
	}
	for _, path := range [][]string{{"run"}, {"plan"}, {"check"}, {"status"}} {
		if out, _, _ := runCLI(context.Background(), nil, append(path, "-h")...); !strings.Contains(out, "--metrics-address host:port") {
			t.Errorf("%v -h does not name --metrics-address", path)
		}
	}
}
