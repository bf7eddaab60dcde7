// Package testenv starts the real components gcagent's tests run against: a
// private containerd (Debian's 1.6 or a 2.3 built by `make deps`), CRI pods
// driven like a kubelet, images built in Go, and an embedded NATS server.
// Everything it starts is stopped, unmounted and removed by t.Cleanup, also
// when the test fails.
//
// Under CI=true a missing component fails the test; elsewhere it skips with
// the make target that installs it.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"
)

// Version selects a containerd daemon.
type Version string

// The daemons the tests run against.
const (
	V16 Version = "1.6" // Debian's containerd package
	V23 Version = "2.3" // built from the 2.3 LTS line by `make deps`
)

// Namespace is the containerd namespace tests use, the kubelet's.
const Namespace = "k8s.io"

// Containerd2Version is the 2.3 LTS release `make deps` builds.
const Containerd2Version = "v2.3.7"

// Versions returns the daemons to test against: GCAGENT_TEST_CONTAINERD as a
// comma-separated list, or both.
func Versions() []Version {
	if v := os.Getenv("GCAGENT_TEST_CONTAINERD"); v != "" {
		var out []Version
		for _, s := range strings.Split(v, ",") {
			out = append(out, Version(strings.TrimSpace(s)))
		}
		return out
	}
	return []Version{V16, V23}
}

// Require stops the test when a component is missing: a failure under
// CI=true, a skip naming the make target elsewhere.
func Require(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (CI=true: end-to-end tests never skip); run `make deps`", what)
	}
	t.Skipf("%s is missing; run `make deps` to install it", what)
}

// BinDir returns where a daemon's binaries are, or "" if not installed.
func BinDir(v Version) string {
	switch v {
	case V16:
		if _, err := os.Stat("/usr/bin/containerd"); err == nil {
			return "/usr/bin"
		}
	case V23:
		dir := os.Getenv("GCAGENT_TEST_CONTAINERD2_DIR")
		if dir == "" {
			home, _ := os.UserHomeDir()
			dir = filepath.Join(home, ".cache", "gcagent", "containerd-"+Containerd2Version)
		}
		if _, err := os.Stat(filepath.Join(dir, "containerd")); err == nil {
			return dir
		}
	}
	return ""
}

// Options configures a private containerd.
type Options struct {
	Version Version
	// RootSize, if set (e.g. "256m"), puts containerd's root on a tmpfs of
	// that size, for disk-pressure tests.
	RootSize string
	// SandboxImage is CRI's pause image. Default SandboxImage.
	SandboxImage string
	// MaxSendBytes, if set, is the daemon's gRPC send limit
	// ([grpc] max_send_message_size; containerd's default is 16 MiB).
	MaxSendBytes int
	// Nice, if set, is the niceness the daemon and its shims run at
	// (nice(1)): a test that only needs the daemon's throughput (seeding
	// tens of thousands of records) leaves the CPU to the tests beside it
	// that measure how soon something happens.
	Nice int
}

// SandboxImage is the pause image name tests configure for CRI.
const SandboxImage = "registry.test/pause:3.10"

// Containerd is a running private daemon.
type Containerd struct {
	Version      Version
	Dir          string // everything lives below it
	Root         string // containerd root (tmpfs when RootSize is set)
	Address      string // grpc socket
	PodLogDir    string // where CRI pods write logs, like /var/log/pods
	LogDir       string // where the emulated kubelet links logs, like /var/log/containers
	SandboxImage string
	Client       *client.Client
	maxSend      int
	nice         int

	t       testing.TB
	ns      string // the helpers' namespace; empty: Namespace
	bin     string
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile string
	// afterStop runs at the end of cleanup, once the daemon and its shims
	// are gone (the cgroups of a kubelet's pods).
	afterStop []func()
}

// StartContainerd starts a private daemon and returns it connected.
func StartContainerd(t testing.TB, opts Options) *Containerd {
	t.Helper()
	if os.Geteuid() != 0 {
		Require(t, false, "root (containerd needs it)")
	}
	bin := BinDir(opts.Version)
	Require(t, bin != "", "containerd "+string(opts.Version))
	_, err := exec.LookPath("runc")
	Require(t, err == nil, "runc")
	if opts.SandboxImage == "" {
		opts.SandboxImage = SandboxImage
	}
	// Unix socket paths are limited to 108 bytes: keep the dir short.
	dir, err := os.MkdirTemp("", "gcat-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{
		Version:      opts.Version,
		Dir:          dir,
		Root:         filepath.Join(dir, "root"),
		Address:      filepath.Join(dir, "c.sock"),
		PodLogDir:    filepath.Join(dir, "pods"),
		LogDir:       filepath.Join(dir, "containers"),
		SandboxImage: opts.SandboxImage,
		maxSend:      opts.MaxSendBytes,
		nice:         opts.Nice,
		t:            t,
		bin:          bin,
		logFile:      filepath.Join(dir, "containerd.log"),
	}
	t.Cleanup(c.cleanup)
	for _, d := range []string{c.Root, filepath.Join(dir, "state"), c.PodLogDir, c.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if opts.RootSize != "" {
		if err := unix.Mount("tmpfs", c.Root, "tmpfs", 0, "size="+opts.RootSize); err != nil {
			t.Fatalf("mount tmpfs on %s: %v", c.Root, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(c.config()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start()
	cl, err := client.New(c.Address, client.WithDefaultNamespace(Namespace), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("containerd client: %v", err)
	}
	c.Client = cl
	return c
}

// Ctx returns a context in the daemon view's namespace (Namespace unless
// InNamespace chose another).
func (c *Containerd) Ctx() context.Context {
	if c.ns != "" {
		return namespaces.WithNamespace(context.Background(), c.ns)
	}
	return namespaces.WithNamespace(context.Background(), Namespace)
}

// InNamespace returns a view of the same daemon whose helpers (Import,
// RunNative, ...) work in containerd namespace ns, as a client such as
// nerdctl (default) or BuildKit (buildkit) would. Stop, Restart and the
// like act on the one daemon.
func (c *Containerd) InNamespace(ns string) *Containerd {
	cp := *c
	cp.ns = ns
	return &cp
}

func (c *Containerd) config() string {
	state := filepath.Join(c.Dir, "state")
	grpcLimits := ""
	if c.maxSend > 0 {
		grpcLimits = fmt.Sprintf("\n  max_send_message_size = %d", c.maxSend)
	}
	if c.Version == V16 {
		return fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q%s
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_tcp_service = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = %q
`, c.Root, state, c.Address, grpcLimits, c.Address+".t", c.SandboxImage, filepath.Join(c.Dir, "cni"))
	}
	return fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri"]
[grpc]
  address = %q%s
[ttrpc]
  address = %q
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    conf_dir = %q
`, c.Root, state, c.Address, grpcLimits, c.Address+".t", c.SandboxImage, filepath.Join(c.Dir, "cni"))
}

func (c *Containerd) start() {
	t := c.t
	t.Helper()
	logf, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{filepath.Join(c.bin, "containerd"), "--config", filepath.Join(c.Dir, "config.toml"), "--log-level", "info"}
	if c.nice != 0 {
		args = append([]string{"nice", "-n", strconv.Itoa(c.nice)}, args...) // nice execs the daemon: the same pid
	}
	cmd := exec.Command(args[0], args[1:]...)
	// The daemon finds its shim on PATH; a 2.3 daemon cannot start the 1.6 shim.
	cmd.Env = append(os.Environ(), "PATH="+c.bin+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start containerd %s: %v", c.Version, err)
	}
	logf.Close()
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(c.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(c.Address); err == nil {
			if ok := c.serving(); ok {
				return
			}
		}
		select {
		case <-c.exited:
			t.Fatalf("containerd %s exited at start:\n%s", c.Version, c.LogTail(40))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd %s not serving after 30s:\n%s", c.Version, c.LogTail(40))
		}
	}
}

func (c *Containerd) serving() bool {
	cl, err := client.New(c.Address, client.WithTimeout(time.Second))
	if err != nil {
		return false
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ok, err := cl.IsServing(ctx)
	return err == nil && ok
}

// Stop stops the daemon and leaves its shims and containers running, as a
// daemon restart on a real node does.
func (c *Containerd) Stop() {
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	c.cmd = nil
}

// Freeze stops the daemon with SIGSTOP (hung, socket still open) until
// Thaw or the end of the test.
func (c *Containerd) Freeze() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatal(err)
	}
	pid := c.cmd.Process.Pid
	c.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
}

// Thaw resumes a frozen daemon (SIGCONT).
func (c *Containerd) Thaw() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatal(err)
	}
}

// Restart stops and starts the daemon; the Client reconnects by itself.
func (c *Containerd) Restart() {
	c.t.Helper()
	c.Stop()
	c.start()
}

// RestartWithSendLimit restarts the daemon with its gRPC send limit set
// to bytes ([grpc] max_send_message_size; 0: containerd's default, 16 MiB).
func (c *Containerd) RestartWithSendLimit(bytes int) {
	c.t.Helper()
	c.maxSend = bytes
	if err := os.WriteFile(filepath.Join(c.Dir, "config.toml"), []byte(c.config()), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.Restart()
}

// LogTail returns the last n lines of the daemon's log.
func (c *Containerd) LogTail(n int) string {
	b, _ := os.ReadFile(c.logFile)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (c *Containerd) cleanup() {
	if c.t.Failed() {
		c.t.Logf("containerd %s log tail:\n%s", c.Version, c.LogTail(30))
	}
	if c.Client != nil && c.cmd != nil {
		c.killTasks()
	}
	if c.Client != nil {
		c.Client.Close()
	}
	c.Stop()
	killUnder(c.Dir)
	unmountUnder(c.Dir)
	if err := os.RemoveAll(c.Dir); err != nil {
		c.t.Logf("remove %s: %v", c.Dir, err)
	}
	for _, fn := range c.afterStop {
		fn()
	}
}

// killTasks kills every task of every namespace, so no shim outlives the test.
func (c *Containerd) killTasks() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nss, err := c.Client.NamespaceService().List(ctx)
	if err != nil {
		return
	}
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		ctrs, err := c.Client.Containers(nctx)
		if err != nil {
			continue
		}
		for _, ctr := range ctrs {
			task, err := ctr.Task(nctx, nil)
			if err != nil {
				continue
			}
			_ = task.Kill(nctx, syscall.SIGKILL)
			if ch, err := task.Wait(nctx); err == nil {
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
				}
			}
			_, _ = task.Delete(nctx)
		}
	}
}

// killUnder kills processes whose command line names dir (leftover shims).
func killUnder(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(dir)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	for _, m := range mountsUnder(dir) {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
}

func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			mp := unescapeMount(fields[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}
