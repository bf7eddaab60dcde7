package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// badRunValues is a bad value for every flag of `gcagent run`, with what
// else the value needs to be judged (e.g. credentials need --nats-url).
// TestBadSettingsExitTwo fails when run gains a flag this table lacks.
var badRunValues = map[string]struct {
	value string
	extra []string
}{
	"allow-remote-gc":                       {value: "maybe"},
	"cluster":                               {value: "\x01"},
	"config":                                {value: "/nonexistent/gcagent.conf"},
	"containerd-address":                    {value: " "},
	"disk-interval":                         {value: "0s"},
	"dry-run":                               {value: "maybe"},
	"embedded-nats-listen":                  {value: "garbage"},
	"embedded-nats-max-age":                 {value: "1h"},
	"embedded-nats-max-store":               {value: "256XB"},
	"exclude-namespace":                     {value: "*"},
	"heartbeat-interval":                    {value: "30"},
	"host-pod-log-dir":                      {value: "var/log/pods"},
	"image-fs":                              {value: "relative/dir"},
	"image-gc-high-threshold":               {value: "101"},
	"image-gc-low-threshold":                {value: "-1"},
	"image-maximum-gc-age":                  {value: "1m"},
	"keep-image":                            {value: "[x"},
	"keep-list-wait":                        {value: "-1s"},
	"kubelet-config":                        {value: "/"}, // a dir; an absent file is a warning: it may come
	"kubelet-status-lag":                    {value: "-1s"},
	"log-dir":                               {value: "var/log/containers"},
	"log-format":                            {value: "xml"},
	"log-level":                             {value: "loud"},
	"maximum-dead-containers":               {value: "-2"},
	"maximum-dead-containers-per-container": {value: "many"},
	"metrics-address":                       {value: "garbage"},
	"minimum-container-ttl-duration":        {value: "-1s"},
	"minimum-image-ttl-duration":            {value: "5"},
	"namespace":                             {value: "k8s.io,,default"},
	"nats-creds":                            {value: "/nonexistent/node.creds", extra: []string{"--nats-url=nats://127.0.0.1:1"}},
	"nats-nkey":                             {value: "/nonexistent/seed"},
	"nats-no-create-stream":                 {value: "maybe"},
	"nats-password":                         {value: "secret", extra: []string{"--nats-url=nats://127.0.0.1:1"}},
	"nats-stream":                           {value: "a.b"},
	"nats-js-domain":                        {value: "a.b"},
	"nats-tls-ca":                           {value: "/nonexistent/ca.pem", extra: []string{"--nats-url=nats://127.0.0.1:1"}},
	"nats-tls-cert":                         {value: "/nonexistent/cert.pem", extra: []string{"--nats-url=nats://127.0.0.1:1"}},
	"nats-tls-key":                          {value: "/nonexistent/key.pem", extra: []string{"--nats-url=nats://127.0.0.1:1"}},
	"nats-token":                            {value: "t", extra: []string{"--nats-url=nats://127.0.0.1:1", "--nats-user=u"}},
	"nats-url":                              {value: "ftp://nats.example"},
	"nats-user":                             {value: "u"},
	"nerdctl-data-root":                     {value: "var/lib/nerdctl"},
	"node-name":                             {value: "\x01"},
	"outbox-max-age":                        {value: "0s"},
	"outbox-max-bytes":                      {value: "0"},
	"pod-log-dir":                           {value: "/var/log/containers/pods"},
	"pod-log-grace":                         {value: "soon"},
	"profiling":                             {value: "maybe"},
	"prune-containers":                      {value: "some"},
	"regret-window":                         {value: "0s"},
	"resync-interval":                       {value: "10ms"},
	"sandbox-image":                         {value: "Not A Reference"},
	"state-dir":                             {value: " "},
	"take-over":                             {value: "maybe"},
	"trace-max-age":                         {value: "-1h"},
	"trace-max-bytes":                       {value: "1000"},
	"uncollected-exit-grace":                {value: "0s"},
}

// TestBadSettingsExitTwo: every flag of run, as a flag, as its GCAGENT_
// variable and as a config file key, with a bad value: the binary exits
// with status 2 and one line that names the setting, and starts nothing
// (its state dir is not created). So do an unknown GCAGENT_ variable and
// bad flags of the other commands.
func TestBadSettingsExitTwo(t *testing.T) {
	t.Parallel()
	bin := testenv.AgentBinary(t)
	flags := runFlagNames(t, bin)
	for _, f := range flags {
		if _, ok := badRunValues[f]; !ok {
			t.Errorf("flag --%s has no bad value in badRunValues", f)
		}
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	safe := map[string]string{"state-dir": state, "containerd-address": filepath.Join(dir, "none.sock"),
		"metrics-address": "127.0.0.1:0", "embedded-nats-listen": "127.0.0.1:0"}
	// baseFor is run with settings that keep a wrongly started agent to
	// itself, leaving out the one under test (a flag would win over its
	// variable or file key).
	baseFor := func(f string) []string {
		args := []string{"run"}
		for _, name := range slices.Sorted(maps.Keys(safe)) {
			if name != f {
				args = append(args, "--"+name+"="+safe[name])
			}
		}
		return args
	}
	base := baseFor("")
	run := func(t *testing.T, args, env []string, mustName string) {
		t.Helper()
		defer os.RemoveAll(state)
		// A value wrongly accepted starts the agent, which then runs
		// until this deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%v %v: %v, want exit status 2; stderr %q", env, args, err, stderr.String())
		}
		lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
		if len(lines) != 1 || stdout.Len() != 0 {
			t.Fatalf("%v %v: stderr %q stdout %q, want one line", env, args, stderr.String(), stdout.String())
		}
		if !strings.Contains(lines[0], mustName) {
			t.Errorf("%v %v: %q does not name %s", env, args, lines[0], mustName)
		}
		if _, err := os.Stat(state); !os.IsNotExist(err) {
			t.Fatalf("%v %v: state dir created (%v): something started", env, args, err)
		}
	}
	for _, f := range flags {
		bad := badRunValues[f]
		env := "GCAGENT_" + strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
		t.Run(f, func(t *testing.T) {
			// A flag names itself (the argument parser or the check of
			// the value); so does a variable, or the flag it sets.
			run(t, append(append(slices.Clone(base), bad.extra...), "--"+f+"="+bad.value), nil, f)
			args := append(baseFor(f), bad.extra...)
			if f == "config" {
				run(t, args, []string{env + "=" + bad.value}, "/nonexistent/gcagent.conf")
				return
			}
			run(t, args, []string{env + "=" + bad.value}, f)
			file := filepath.Join(t.TempDir(), "gcagent.conf")
			if err := os.WriteFile(file, fmt.Appendf(nil, "%s = %s\n", f, bad.value), 0o600); err != nil {
				t.Fatal(err)
			}
			run(t, append(slices.Clone(args), "--config", file), nil, f)
		})
	}
	t.Run("unknown variable", func(t *testing.T) {
		run(t, base, []string{"GCAGENT_IMAGE_GC_HIGHTHRESHOLD=90"}, "GCAGENT_IMAGE_GC_HIGH_THRESHOLD")
	})
	t.Run("unknown file key", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "gcagent.conf")
		if err := os.WriteFile(file, []byte("image-gc-highthreshold = 90\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		run(t, append(slices.Clone(base), "--config", file), nil, "image-gc-highthreshold")
	})
	for _, tc := range []struct {
		args     []string
		mustName string
	}{
		{[]string{"watch", "--since=banana"}, "since"},
		{[]string{"watch", "--refresh=0s"}, "refresh"},
		{[]string{"ctl", "--timeout=5"}, "timeout"},
		{[]string{"ctl", "status", "extra"}, "extra"},
		{[]string{"status", "--json=maybe"}, "json"},
		{[]string{"plan", "--json=maybe"}, "json"},
		{[]string{"plan", "--image-gc-high-threshold=101"}, "image-gc-high-threshold"},
		{[]string{"check", "--json=maybe"}, "json"},
		{[]string{"check", "--kubelet-config=/"}, "kubelet-config"},
		{[]string{"frobnicate"}, "frobnicate"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { run(t, tc.args, nil, tc.mustName) })
	}
}

// runFlagNames reads the flags of `gcagent run -h` (printed on stdout).
func runFlagNames(t *testing.T, bin string) []string {
	out, err := exec.Command(bin, "run", "-h").Output()
	if err != nil {
		t.Fatalf("run -h: %v", err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) < 40 {
		t.Fatalf("run -h lists %d flags on stdout, want them all:\n%s", len(names), out)
	}
	return names
}
