package logs

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

func TestTargetInView(t *testing.T) {
	same := Config{LogDir: "/var/log/containers", PodLogDir: "/var/log/pods"}
	mapped := same
	mapped.PodLogDir, mapped.HostPodLogDir = "/host/pods", "/var/log/pods"
	for _, tc := range []struct {
		name   string
		cfg    Config
		target string
		want   string // "" when not in view
	}{
		{"default, under the pod log dir", same, "/var/log/pods/ns_p_u/app/0.log", "/var/log/pods/ns_p_u/app/0.log"},
		{"default, elsewhere", same, "/data/pods/ns_p_u/app/0.log", ""},
		{"default, prefix of a name only", same, "/var/log/pods-old/ns_p_u/app/0.log", ""},
		{"default, the dir itself", same, "/var/log/pods", ""},
		{"default, dot-dot out", same, "/var/log/pods/../secret.log", ""},
		{"default, relative into pods", same, "../pods/ns_p_u/app/0.log", "/var/log/pods/ns_p_u/app/0.log"},
		{"default, relative elsewhere", same, "other.log", ""},
		{"mapped, under the host's dir", mapped, "/var/log/pods/ns_p_u/app/0.log", "/host/pods/ns_p_u/app/0.log"},
		{"mapped, under the agent's path", mapped, "/host/pods/ns_p_u/app/0.log", ""},
		{"mapped, relative", mapped, "../pods/ns_p_u/app/0.log", ""},
		{"mapped, elsewhere", mapped, "/data/x.log", ""},
		{"host dir given as the pod log dir", Config{LogDir: "/c", PodLogDir: "/p", HostPodLogDir: "/p"}, "/p/x/0.log", "/p/x/0.log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.cfg.TargetInView(tc.target)
			if ok != (tc.want != "") || got != tc.want {
				t.Errorf("TargetInView(%q) = %q, %v; want %q", tc.target, got, ok, tc.want)
			}
		})
	}
	for _, bad := range []string{"relative/pods", "/var/log/pods/", "/"} {
		c := same
		c.HostPodLogDir = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--host-pod-log-dir") {
			t.Errorf("HostPodLogDir %q: Validate = %v, want an error naming --host-pod-log-dir", bad, err)
		}
	}
}

// TestHostPodLogDir: the kubelet's links point into the host's pod log dir
// (here a path that does not exist), which the agent sees at PodLogDir.
// Unmapped, no link whose stat fails is taken for dangling: all are kept
// as unverifiable, said once in the log, in Problems and in the gauge.
// Mapped, the link whose log exists is kept, the really dangling one goes,
// and one pointing elsewhere is still unverifiable.
func TestHostPodLogDir(t *testing.T) {
	cfg, st := txDirs(t)
	host := filepath.Join(t.TempDir(), "host", "var", "log", "pods") // never created
	pod := "ns_p_uid2"
	st.setPod("uid2", fakePod{alive: true})
	writeFile(t, filepath.Join(cfg.PodLogDir, pod, "app", "0.log"), "exists on the host\n")
	kept := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("e")+".log")
	symlink(t, filepath.Join(host, pod, "app", "0.log"), kept)
	st.setContainer(cid("d"), false)
	dangling := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("d")+".log")
	symlink(t, filepath.Join(host, pod, "app", "1.log"), dangling)
	st.setContainer(cid("f"), false)
	stray := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("f")+".log")
	symlink(t, "/nonexistent-gcagent/x.log", stray)

	run := func(cfg Config, passes int) (*Cleaner, *Metrics, string) {
		t.Helper()
		var logBuf bytes.Buffer
		m, _ := NewMetrics(nil)
		deletes, _ := newDeletes(t, lstatChecker{})
		c, err := New(Deps{State: st, Deletes: deletes}, Options{Config: cfg, Metrics: m,
			Log: zerolog.New(&logBuf), Clock: clock.System(func() time.Time { return t0.Add(time.Hour) })})
		if err != nil {
			t.Fatal(err)
		}
		for range passes {
			if _, err := c.Clean(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return c, m, logBuf.String()
	}

	c, m, logs := run(cfg, 3)
	for _, p := range []string{kept, dangling, stray} {
		if !exists(p) {
			t.Errorf("unmapped: %s removed", p)
		}
	}
	if n := strings.Count(logs, `"reason":"target-unverifiable"`); n != 1 {
		t.Errorf("unmapped: %d warnings over 3 passes, want 1:\n%s", n, logs)
	}
	if got := testutil.ToFloat64(m.unverifiable); got != 3 {
		t.Errorf("unmapped: gauge %v, want 3", got)
	}
	if p := c.Problems(); len(p) != 1 || !strings.Contains(p[0], "3 log links kept unverified") || !strings.Contains(p[0], "--host-pod-log-dir") {
		t.Errorf("unmapped: Problems() = %q", p)
	}
	if p := c.Status().Problems; len(p) != 1 {
		t.Errorf("unmapped: Status().Problems = %q", p)
	}

	cfg.HostPodLogDir = host
	c, m, _ = run(cfg, 1)
	if !exists(kept) || !exists(stray) {
		t.Errorf("mapped: a link whose log exists, or one it cannot check, was removed")
	}
	if exists(dangling) {
		t.Errorf("mapped: the dangling link %s is still there", dangling)
	}
	if got := testutil.ToFloat64(m.unverifiable); got != 1 {
		t.Errorf("mapped: gauge %v, want 1 (the stray link)", got)
	}
	reasons := map[string]Reason{}
	for _, d := range c.Status().Decisions {
		reasons[d.Name] = d.Reason
	}
	if r := reasons[filepath.Base(kept)]; r != ReasonTargetExists {
		t.Errorf("mapped: the link whose log exists is kept for %q, want %q", r, ReasonTargetExists)
	}
	if r := reasons[filepath.Base(stray)]; r != ReasonTargetUnverifiable {
		t.Errorf("mapped: the stray link is kept for %q, want %q", r, ReasonTargetUnverifiable)
	}
}

// TestReadlinkatGrows: a target longer than the first buffer is read whole.
func TestReadlinkatGrows(t *testing.T) {
	dir := t.TempDir()
	target := "/nonexistent/" + strings.Repeat("abcdefg/", 500) + "0.log" // over 4000 bytes
	symlink(t, target, filepath.Join(dir, "l.log"))
	fd, err := openRoot(dir)
	if err != nil || fd < 0 {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got, err := readlinkat(fd, "l.log"); err != nil || got != target {
		t.Errorf("readlinkat = %d bytes, %v; want %d bytes", len(got), err, len(target))
	}
}
