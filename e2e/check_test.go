package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/testenv"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCheck: `gcagent check` on a healthy private node says OK on every
// line and exits 0; with one thing broken at a time, the line about it
// FAILs (exit status 1) or WARNs (exit status 0), and the others stay OK.
// With an agent running on the state dir, the NATS line reaches its
// embedded server.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testCheck(t, v) })
	}
}

func testCheck(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "64m"})
	c.Import(t, testenv.Pause(c.SandboxImage)) // creates the managed namespace k8s.io
	kdir := writeKubeletConfigs(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	// A read-only filesystem: as root, chmod would not stop a write.
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", readOnly, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
		t.Fatalf("mount a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(readOnly, unix.MNT_DETACH) })

	healthy := map[string]string{"containerd-address": c.Address, "namespace": testenv.Namespace, "image-fs": c.Root,
		"log-dir": c.LogDir, "pod-log-dir": c.PodLogDir, "state-dir": state, "metrics-address": testenv.FreeAddr(t),
		"kubelet-config": filepath.Join(kdir, "gc-off.yaml"), "node-name": "test-node"}
	check := func(t *testing.T, change map[string]string) ([]agent.CheckResult, int) {
		t.Helper()
		args := []string{"check", "--json"}
		for name, val := range healthy {
			if v, ok := change[name]; ok {
				val = v
			}
			args = append(args, "--"+name+"="+val)
		}
		for name, val := range change {
			if _, ok := healthy[name]; !ok {
				args = append(args, "--"+name+"="+val)
			}
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(testenv.AgentBinary(t), args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var res []agent.CheckResult
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("check --json: %v\n%s\nstderr %s", err, stdout.String(), stderr.String())
		}
		return res, code
	}
	names := []string{"containerd", "cri", "namespaces", "image-fs", "log-dir", "pod-log-dir", "state-dir",
		"plain-containers", "kubelet-config", "kubelet-eviction", "nats", "clock", "fail-closed"}

	t.Run("healthy", func(t *testing.T) {
		res, code := check(t, nil)
		var got []string
		for _, r := range res {
			got = append(got, r.Name)
			if r.Status != agent.CheckOK {
				t.Errorf("%s %s: %s", r.Status, r.Name, r.Detail)
			}
		}
		if strings.Join(got, " ") != strings.Join(names, " ") || code != 0 {
			t.Errorf("checks %q exit %d, want %q exit 0", got, code, names)
		}
		if r := res[0]; !strings.Contains(r.Detail, "containerd "+map[testenv.Version]string{testenv.V16: "1.6", testenv.V23: "2.3"}[v]) {
			t.Errorf("containerd line %q does not name the version", r.Detail)
		}
		t.Logf("%+v", res)
	})

	for _, tc := range []struct {
		name   string
		change map[string]string
		line   string
		status string
		detail string
	}{
		{"socket missing", map[string]string{"containerd-address": filepath.Join(dir, "none.sock")}, "containerd", agent.CheckFail, "does not exist"},
		{"log dir not mounted", map[string]string{"log-dir": filepath.Join(dir, "no-links")}, "log-dir", agent.CheckWarn, "does not exist"},
		{"pod log dir not mounted", map[string]string{"pod-log-dir": filepath.Join(dir, "no-pods")}, "pod-log-dir", agent.CheckWarn, "does not exist"},
		{"state dir read-only", map[string]string{"state-dir": readOnly}, "state-dir", agent.CheckFail, "read-only"},
		{"kubelet image GC on", map[string]string{"kubelet-config": filepath.Join(kdir, "defaults.yaml")}, "kubelet-config", agent.CheckWarn, "image GC is on"},
		{"kubelet eviction first", map[string]string{"kubelet-config": filepath.Join(kdir, "gc-on-eviction.yaml"), "image-gc-high-threshold": "90"}, "kubelet-eviction", agent.CheckWarn, "imagefs.available<20%"},
		{"NATS refused", map[string]string{"nats-url": "nats://" + testenv.FreeAddr(t)}, "nats", agent.CheckFail, "no servers available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, code := check(t, tc.change)
			wantCode := map[string]int{agent.CheckFail: 1, agent.CheckWarn: 0}[tc.status]
			if code != wantCode {
				t.Errorf("exit %d, want %d", code, wantCode)
			}
			found := false
			for _, r := range res {
				switch {
				case r.Name == tc.line:
					found = true
					if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
						t.Errorf("%s %s: %s; want %s with %q", r.Status, r.Name, r.Detail, tc.status, tc.detail)
					}
					t.Logf("%s %s: %s", r.Status, r.Name, r.Detail)
				case tc.name == "socket missing" && (r.Name == "cri" || r.Name == "namespaces" || r.Name == "image-fs"):
					// They ask the same missing socket.
				case strings.HasPrefix(tc.name, "kubelet") && strings.HasPrefix(r.Name, "kubelet"):
					// Both lines read the same file.
				case r.Status != agent.CheckOK:
					t.Errorf("%s %s: %s; want OK", r.Status, r.Name, r.Detail)
				}
			}
			if !found {
				t.Errorf("no %s line in %+v", tc.line, res)
			}
		})
	}

	// An exited plain container (a `ctr run -d` on a kubelet node): check
	// counts it and says the agent removes it, or that
	// --prune-containers=off keeps it.
	t.Run("plain container exited", func(t *testing.T) {
		c.Import(t, testenv.Runnable("example.test/debug:1"))
		c.WaitExit(t, c.RunNative(t, "debug-1", "example.test/debug:1", "true"))
		for _, tc := range []struct {
			change map[string]string
			want   string
		}{
			{nil, "the agent removes each plain container"},
			{map[string]string{"prune-containers": "off"}, "kept: --prune-containers=off"},
		} {
			res, code := check(t, tc.change)
			for _, r := range res {
				if r.Name == "plain-containers" && (r.Status != agent.CheckOK || !strings.Contains(r.Detail, "1 exited now in k8s.io") ||
					!strings.Contains(r.Detail, tc.want)) {
					t.Errorf("%s plain-containers: %s; want OK counting 1 and saying %q", r.Status, r.Detail, tc.want)
				}
			}
			if code != 0 {
				t.Errorf("exit %d", code)
			}
		}
	})

	// A running CRI pod: the pod log dir the kubelet writes holds its dir;
	// an empty dir mounted in its place (the kubelet writes elsewhere) WARNs.
	t.Run("pod log dir elsewhere", func(t *testing.T) {
		rt, _ := c.CRI(t)
		p := c.RunPod(t, rt, "web", "default", "uid-check-1")
		res, code := check(t, nil)
		for _, r := range res {
			if r.Name == "pod-log-dir" && (r.Status != agent.CheckOK || !strings.Contains(r.Detail, "1 of 1 running pods")) {
				t.Errorf("%s pod-log-dir: %s; want OK with 1 of 1 running pods", r.Status, r.Detail)
			}
		}
		if code != 0 {
			t.Errorf("exit %d", code)
		}
		empty := filepath.Join(dir, "empty-pods")
		if err := os.MkdirAll(empty, 0o755); err != nil {
			t.Fatal(err)
		}
		res, code = check(t, map[string]string{"pod-log-dir": empty})
		for _, r := range res {
			if r.Name == "pod-log-dir" && (r.Status != agent.CheckWarn || !strings.Contains(r.Detail, "default_web_uid-check-1")) {
				t.Errorf("%s pod-log-dir: %s; want WARN naming the pod's dir", r.Status, r.Detail)
			}
		}
		if code != 0 {
			t.Errorf("exit %d", code)
		}
		ctx, cancel := context.WithTimeout(c.Ctx(), time.Minute)
		defer cancel()
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.SandboxID}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("agent running", func(t *testing.T) {
		a := testenv.StartAgent(t, c, state, "--kubelet-config", filepath.Join(kdir, "gc-off.yaml"))
		testenv.Eventually(t, 20*time.Second, func() string {
			if code, _, err := a.GetText("/readyz"); code != 200 {
				return "agent not ready: " + errString(err)
			}
			return ""
		})
		res, code := check(t, map[string]string{"metrics-address": a.Addr})
		for _, r := range res {
			if r.Name == "nats" && (r.Status != agent.CheckOK || !strings.Contains(r.Detail, "connected")) {
				t.Errorf("%s nats: %s; want OK, connected to the agent's embedded server", r.Status, r.Detail)
			}
			if r.Status != agent.CheckOK {
				t.Errorf("%s %s: %s", r.Status, r.Name, r.Detail)
			}
		}
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
