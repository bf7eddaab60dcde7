package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// CrictlVersion is the cri-tools release `make deps` builds crictl from.
const CrictlVersion = "v1.37.0"

// CrictlPath returns the crictl `make deps` built (GCAGENT_TEST_CRICTL_DIR, else
// its cache dir); a missing one fails the test under CI=true and skips it
// elsewhere.
func CrictlPath(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("GCAGENT_TEST_CRICTL_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gcagent", "crictl-"+CrictlVersion)
	}
	bin := filepath.Join(dir, "crictl")
	_, err := os.Stat(bin)
	Require(t, err == nil, "crictl "+CrictlVersion+" ("+bin+")")
	return bin
}

// CrictlResult is one crictl run: what its user saw.
type CrictlResult struct {
	Args           []string
	Stdout, Stderr string
	Code           int // exit status; -1 when it did not run to an exit
}

// Crictl runs crictl against the daemon's CRI, with a config file of its
// own (the host's /etc/crictl.yaml is never read), within timeout.
func (c *Containerd) Crictl(t testing.TB, timeout time.Duration, args ...string) CrictlResult {
	t.Helper()
	bin := CrictlPath(t)
	cfg := filepath.Join(c.Dir, "crictl.yaml")
	if _, err := os.Stat(cfg); err != nil {
		ep := "unix://" + c.Address
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\ndebug: false\n", ep, ep)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append([]string{"--config", cfg}, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	r := CrictlResult{Args: args, Code: -1}
	err := cmd.Run()
	r.Stdout, r.Stderr = stdout.String(), stderr.String()
	if cmd.ProcessState != nil {
		r.Code = cmd.ProcessState.ExitCode()
	}
	if err != nil && r.Code <= 0 {
		t.Fatalf("crictl %v: %v\n%s", args, err, r.Stderr)
	}
	return r
}

// MustCrictl is Crictl that fails the test unless crictl exits 0, and
// returns its stdout.
func (c *Containerd) MustCrictl(t testing.TB, args ...string) string {
	t.Helper()
	r := c.Crictl(t, 2*time.Minute, args...)
	if r.Code != 0 {
		t.Fatalf("crictl %v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}
