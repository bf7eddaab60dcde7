package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
)

// unitDirectives returns the values of each key of a unit file, in order.
func unitDirectives(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "[") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("%s: line %q is not key=value", path, l)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// verifyUnit runs `systemd-analyze verify` on unit inside a root that holds
// the system's units and the agent binary at the unit's ExecStart path, and
// returns its output (empty when it accepts the unit without a warning).
func verifyUnit(t *testing.T, unit []byte, name string) (string, error) {
	t.Helper()
	root := t.TempDir()
	sysUnits := "/usr/lib/systemd/system"
	if err := os.CopyFS(filepath.Join(root, sysUnits), os.DirFS(sysUnits)); err != nil {
		t.Fatalf("copy %s: %v", sysUnits, err)
	}
	bin := filepath.Join(root, "usr/local/bin/gcagent")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(testenv.AgentBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "etc/systemd/system")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, name).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestSystemdUnitVerifies: systemd-analyze accepts the shipped unit without
// a single warning, and the same check rejects a misspelled directive and a
// wrong service type (systemd-analyze only warns about those, so any output
// counts as a failure).
func TestSystemdUnitVerifies(t *testing.T) {
	_, err := exec.LookPath("systemd-analyze")
	testenv.Require(t, err == nil, "systemd-analyze (Debian package systemd)")
	unit, err := os.ReadFile("systemd/gcagent.service")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := verifyUnit(t, unit, "gcagent.service"); err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for name, mutate := range map[string][2]string{
		"misspelled directive": {"ProtectSystem=strict", "ProtectSystm=strict"},
		"unknown type":         {"Type=notify", "Type=notifyy"},
	} {
		bad := strings.Replace(string(unit), mutate[0], mutate[1], 1)
		if bad == string(unit) {
			t.Fatalf("%s: mutation did not apply", name)
		}
		if out, err := verifyUnit(t, []byte(bad), "gcagent.service"); err == nil && out == "" {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSystemdUnitContract checks the directives the issue asks for.
func TestSystemdUnitContract(t *testing.T) {
	d := unitDirectives(t, "systemd/gcagent.service")
	one := func(k string) string {
		if len(d[k]) != 1 {
			t.Errorf("%s set %d times", k, len(d[k]))
			return ""
		}
		return d[k][0]
	}
	for k, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "ProtectSystem": "strict", "NoNewPrivileges": "yes",
		"ExecStart": "/usr/local/bin/gcagent run", "EnvironmentFile": "-/etc/default/gcagent", "Restart": "always",
		"CapabilityBoundingSet": "", "StateDirectory": "gcagent",
	} {
		if got := one(k); got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	if one("WatchdogSec") == "" {
		t.Error("no WatchdogSec")
	}
	if !strings.Contains(one("After"), "containerd.service") {
		t.Error("not ordered After=containerd.service")
	}
	if slices.ContainsFunc(d["Requires"], func(s string) bool { return strings.Contains(s, "containerd") }) {
		t.Error("Requires=containerd.service would restart the agent with containerd")
	}
	rw := strings.Fields(one("ReadWritePaths"))
	for _, p := range []string{"/var/lib/gcagent", "-/var/log/containers", "-/var/log/pods"} {
		if !slices.Contains(rw, p) {
			t.Errorf("ReadWritePaths lacks %s: %v", p, rw)
		}
	}
	if slices.ContainsFunc(rw, func(p string) bool { return strings.Contains(p, "containerd") }) {
		t.Errorf("ReadWritePaths %v: containerd's files are deleted by containerd, not by the agent", rw)
	}
}
