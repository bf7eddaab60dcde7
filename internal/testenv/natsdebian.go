package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
)

// DebianNATSBinary is Debian's nats-server (`apt-get install nats-server`,
// 2.9.10 on Debian 12): the oldest server gcagent supports, which tests run
// against where a feature depends on the server's version.
const DebianNATSBinary = "/usr/sbin/nats-server"

// ExternalNATS is a nats-server process the test started.
type ExternalNATS struct {
	// URL is its client URL (nats://127.0.0.1:PORT); Port its port.
	URL  string
	Port int
	// Version is what the binary says it is (2.9.10).
	Version  string
	StoreDir string
	t        testing.TB
	cmd      *exec.Cmd
	done     chan struct{}
}

// DebianNATSOptions configure StartDebianNATS.
type DebianNATSOptions struct {
	// Port 0 lets the server pick a free loopback port; give the Port of
	// an earlier server to start again where it was.
	Port int
	// StoreDir is JetStream's store; default a temp dir of the test.
	StoreDir string
}

// StartDebianNATS runs Debian's nats-server with JetStream on loopback,
// and kills it when the test ends. Under CI=true a missing binary fails
// the test (Require).
func StartDebianNATS(t testing.TB, o DebianNATSOptions) *ExternalNATS {
	t.Helper()
	_, err := os.Stat(DebianNATSBinary)
	Require(t, err == nil, "Debian's nats-server ("+DebianNATSBinary+", apt-get install nats-server)")
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	port := o.Port
	if port == 0 {
		port = -1 // the server picks one and writes it to the ports file
	}
	portsDir := t.TempDir()
	s := &ExternalNATS{StoreDir: o.StoreDir, t: t, Version: debianNATSVersion(t)}
	s.cmd = exec.Command(DebianNATSBinary, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", o.StoreDir,
		"--ports_file_dir", portsDir, "-l", filepath.Join(portsDir, "nats-server.log"))
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", DebianNATSBinary, err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(s.Stop)
	// The ports file appears once the server listens.
	file := filepath.Join(portsDir, fmt.Sprintf("nats-server_%d.ports", s.cmd.Process.Pid))
	wait.Until(t, 30*time.Second, DebianNATSBinary+" listening", func() bool {
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(portsDir, "nats-server.log"))
			t.Fatalf("%s exited at start:\n%s", DebianNATSBinary, log)
		default:
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		var ports struct {
			Nats []string `json:"nats"`
		}
		if json.Unmarshal(b, &ports) != nil || len(ports.Nats) == 0 {
			return false
		}
		s.URL = ports.Nats[0]
		_, err = fmt.Sscanf(s.URL[strings.LastIndexByte(s.URL, ':')+1:], "%d", &s.Port)
		return err == nil
	})
	return s
}

// Stop kills the server and waits for it (a server killed, not shut
// down: what a crash or a cut-off host looks like to a client).
func (s *ExternalNATS) Stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// debianNATSVersion asks the binary its version: "2.9.10".
func debianNATSVersion(t testing.TB) string {
	t.Helper()
	out, err := exec.Command(DebianNATSBinary, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", DebianNATSBinary, err, out)
	}
	// nats-server: v2.9.10
	f := strings.Fields(string(out))
	if len(f) == 0 {
		t.Fatalf("%s --version: %q", DebianNATSBinary, out)
	}
	return strings.TrimPrefix(f[len(f)-1], "v")
}
