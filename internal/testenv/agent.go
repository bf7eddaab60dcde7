package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
)

var (
	buildMu sync.Mutex
	builds  = map[Build]built{}
)

// built is one build's binary, or why it failed (not tried again).
type built struct {
	bin string
	err error
}

// ShippedTags are the build tags of every gcagent the Makefile builds
// (BUILD_TAGS): tests run the binary operators get, plus TestTags.
const ShippedTags = "grpcnotrace"

// TestTags are added to every build of the tests: the crash and clock
// hooks the end-to-end tests drive through GCAGENT_TEST_* variables. The
// shipped binary has none (TestShippedBinaryLeavesOutTracing).
const TestTags = "testhooks"

// CallTimeoutEnv, in the environment of an agent of a test build
// (StartAgentEnv), is a Go duration that replaces node.CallTimeout (30 s).
// The shipped binary has no such hook (TestShippedBinaryLeavesOutTracing).
const CallTimeoutEnv = "GCAGENT_TEST_CALL_TIMEOUT"

// ShortCallTimeout is the containerd call timeout of an agent started with
// ShortCallTimeoutEnv: a test that waits out a hung containerd's calls
// waits this instead of node.CallTimeout. A call of a loaded machine's
// working daemon takes far less.
const ShortCallTimeout = 5 * time.Second

// ShortCallTimeoutEnv is the environment (for StartAgentEnv) that gives the
// agent ShortCallTimeout.
func ShortCallTimeoutEnv() []string {
	return []string{CallTimeoutEnv + "=" + ShortCallTimeout.String()}
}

// Build says how AgentBuild builds cmd/gcagent (with ShippedTags).
type Build struct {
	// Tags are Go build tags beside ShippedTags, such as "noembeddednats".
	Tags string
	// Static builds as `make image` does (CGO_ENABLED=0, -trimpath): the
	// binary the DaemonSet runs, but with its symbol table, which is never
	// mapped, so that perf can name its functions (FOOTPRINT_PERF).
	Static bool
}

// AgentBinary builds cmd/gcagent once per test process and returns its path.
func AgentBinary(t testing.TB) string {
	t.Helper()
	return AgentBuild(t, Build{})
}

// AgentBuild is AgentBinary built as b says, once per test process and b.
func AgentBuild(t testing.TB, b Build) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	r, ok := builds[b]
	if !ok {
		r = build(b)
		builds[b] = r
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.bin
}

func build(b Build) built {
	dir, err := os.MkdirTemp("", "gcagent-bin-")
	if err != nil {
		return built{err: err}
	}
	bin := filepath.Join(dir, "gcagent")
	tags := ShippedTags + "," + TestTags
	if b.Tags != "" {
		tags += "," + b.Tags
	}
	args := []string{"build", "-tags", tags, "-o", bin}
	if b.Static {
		args = append(args, "-trimpath")
	}
	cmd := exec.Command("go", append(args, "github.com/gcagent/gcagent/cmd/gcagent")...)
	if b.Static {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return built{err: fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)}
	}
	return built{bin: bin}
}

// Agent is a running gcagent process.
type Agent struct {
	Addr     string // metrics address
	StateDir string
	LogFile  string
	t        testing.TB
	cmd      *exec.Cmd
	done     chan struct{}
}

var (
	addrMu    sync.Mutex
	addrsLent = map[string]bool{}
)

// FreeAddr returns a loopback address with a port that was free just now
// and that no other FreeAddr of this test process returned: tests running
// in parallel do not get the same port before either has bound it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addrMu.Lock()
	defer addrMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !addrsLent[addr] {
			addrsLent[addr] = true
			return addr
		}
	}
}

// StartAgent runs `gcagent run` against the daemon with stateDir and extra
// flags; it is killed when the test ends.
func StartAgent(t testing.TB, c *Containerd, stateDir string, extra ...string) *Agent {
	t.Helper()
	return StartAgentEnv(t, c, stateDir, nil, extra...)
}

// StartAgentEnv is StartAgent with env (KEY=value) added to the agent's environment.
func StartAgentEnv(t testing.TB, c *Containerd, stateDir string, env []string, extra ...string) *Agent {
	t.Helper()
	return StartAgentBin(t, AgentBinary(t), c, stateDir, env, extra...)
}

// StartAgentBin is StartAgentEnv with another agent binary (a baseline to
// compare with).
func StartAgentBin(t testing.TB, bin string, c *Containerd, stateDir string, env []string, extra ...string) *Agent {
	t.Helper()
	a := &Agent{Addr: FreeAddr(t), StateDir: stateDir, t: t}
	a.LogFile = filepath.Join(stateDir, fmt.Sprintf("agent-%d.log", time.Now().UnixNano()))
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run",
		"--containerd-address", c.Address, "--namespace", Namespace, "--state-dir", stateDir,
		"--metrics-address", a.Addr, "--image-fs", c.Root, "--log-dir", c.LogDir, "--pod-log-dir", c.PodLogDir,
		"--node-name", "test-node", "--log-level", "debug",
	}, extra...)
	if !slices.ContainsFunc(extra, func(s string) bool {
		return strings.HasPrefix(s, "--nats-url") || strings.HasPrefix(s, "--embedded-nats-listen")
	}) {
		// Each agent's embedded NATS server gets its own port.
		args = append(args, "--embedded-nats-listen", FreeAddr(t))
	}
	logf, err := os.Create(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if len(env) > 0 {
		a.cmd.Env = append(os.Environ(), env...)
	}
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	a.done = make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		a.Kill()
		if t.Failed() {
			t.Logf("agent log tail:\n%s", a.LogTail(40))
		}
	})
	return a
}

// Kill sends SIGKILL (kill -9) and waits for the process to end.
func (a *Agent) Kill() {
	if a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}

// Exited waits up to within for the process to end by itself and reports whether it did.
func (a *Agent) Exited(within time.Duration) bool {
	select {
	case <-a.done:
		return true
	case <-time.After(within):
		return false
	}
}

// Freeze stops the agent with SIGSTOP until Thaw or the end of the test:
// the kernel keeps queueing its inotify events and containerd its
// events, so a test can build a backlog deterministically.
func (a *Agent) Freeze() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		a.t.Fatal(err)
	}
	pid := a.cmd.Process.Pid
	a.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
}

// Thaw resumes a frozen agent (SIGCONT).
func (a *Agent) Thaw() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		a.t.Fatal(err)
	}
}

// Stop sends SIGTERM and waits for a clean exit.
func (a *Agent) Stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		a.t.Errorf("agent did not stop on SIGTERM")
		a.Kill()
	}
}

// LogTail returns the last n lines the agent logged.
func (a *Agent) LogTail(n int) string {
	b, _ := os.ReadFile(a.LogFile)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Get fetches path from the agent's HTTP server and decodes JSON into v (if
// non-nil). It returns the status code.
func (a *Agent) Get(path string, v any) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if v != nil && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
	}
	return resp.StatusCode, nil
}

// GetText fetches path from the agent's HTTP server and returns the status
// code and the body.
func (a *Agent) GetText(path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Eventually polls cond every 50ms until it returns "" or the deadline
// passes, then fails with cond's last explanation (wait.Every).
func Eventually(t testing.TB, within time.Duration, cond func() string) {
	t.Helper()
	wait.Every(t, within, 50*time.Millisecond, cond)
}

// EventuallyEvery is Eventually looking every interval: a benchmark that
// measures the agent polls it no more often than it must.
func EventuallyEvery(t testing.TB, within, every time.Duration, cond func() string) {
	t.Helper()
	wait.Every(t, within, every, cond)
}
