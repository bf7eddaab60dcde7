package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
)

func TestCheckJudges(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	nss, err := events.ParseNamespaces("k8s.io", "moby")
	if err != nil {
		t.Fatal(err)
	}
	disk := func(capacity, avail uint64) nodeFacts {
		return nodeFacts{imageFS: "/var/lib/containerd", disk: gc.DiskStats{CapacityBytes: capacity, AvailableBytes: avail}}
	}
	running := nodeFacts{pods: []string{"default_web_uid-1"}, podUIDs: map[string]bool{"uid-1": true}}
	podDirs := func(f nodeFacts, dirs ...string) CheckResult { // checkPodLogDir of a new pod log dir holding dirs
		root := filepath.Join(t.TempDir(), "pods")
		for _, d := range append(dirs, "") {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return checkPodLogDir(Config{PodLogDir: root, ContainerdAddress: "/run/containerd/containerd.sock", PodLogGrace: time.Minute}, f)
	}
	for _, tc := range []struct {
		name   string
		got    CheckResult
		status string
		detail string
	}{
		{"image fs below high", checkImageFS(disk(100, 50), 85, 80, 0), CheckOK, "50% used"},
		{"image fs over high", checkImageFS(disk(100, 15), 85, 80, 0), CheckWarn, "GC starts as soon as"},
		{"image fs capacity 0", checkImageFS(disk(0, 0), 85, 80, 0), CheckFail, "capacity 0"},
		{"image GC off", checkImageFS(disk(100, 50), 100, 80, 0), CheckWarn, "image GC off"},
		{"log dir missing", checkLogDir("log-dir", filepath.Join(dir, "none"), "links"), CheckWarn, "does not exist"},
		{"log dir a file", checkLogDir("log-dir", file, "links"), CheckFail, "not a directory"},
		{"pod log dir empty, no pods", podDirs(nodeFacts{}), CheckOK, "0 entries"},
		{"pod log dir empty, pods run", podDirs(running), CheckWarn, "default_web_uid-1"},
		{"pod log dir of the running pods", podDirs(running, "default_web_uid-1"), CheckOK, "1 of 1 running pods have their log dir here"},
		// Issue 42 item 2: dirs of pods the watched CRI does not know are
		// named, and whether the agent removes them.
		{"pod log dir with orphans", podDirs(running, "default_web_uid-1", "default_gone_uid-2", "lost+found"), CheckWarn,
			"1 pod dirs here are of pods CRI at /run/containerd/containerd.sock does not know (e.g. default_gone_uid-2): orphans, the agent removes each once nothing in it changed for --pod-log-grace 1m0s"},
		{"pod log dir of another containerd's pods", podDirs(nodeFacts{podUIDs: map[string]bool{}}, "default_web_uid-7", "default_job_uid-8"), CheckWarn,
			"2 pod dirs here are of pods CRI at /run/containerd/containerd.sock does not know (e.g. default_job_uid-8), and no pod of it has its log dir here: the agent removes none of them"},
		{"pod log dir of another containerd's pods, this one's elsewhere", podDirs(running, "default_job_uid-8"), CheckWarn,
			"no log dir of the 1 running CRI pods (e.g. default_web_uid-1): is this where the kubelet writes (its podLogsDir), mounted from the host?; 1 pod dirs here are of pods CRI at /run/containerd/containerd.sock does not know (e.g. default_job_uid-8): the agent removes none of them"},
		{"state dir writable", checkStateDir(dir, 1), CheckOK, "writable"},
		{"state dir to be made", checkStateDir(filepath.Join(dir, "a", "b"), 1), CheckOK, "run creates it in " + dir},
		{"state dir a file", checkStateDir(file, 1), CheckFail, "not writable"},
		{"state disk small", checkStateDir(dir, 1<<62), CheckWarn, "less than the outbox bound"},
		{"namespaces managed", checkNamespaces(nss, []string{"moby", "k8s.io"}, nil), CheckOK, "managed k8s.io"},
		{"namespaces none managed", checkNamespaces(nss, []string{"moby"}, nil), CheckWarn, "none managed"},
		{"clock not set", checkClock(time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), filepath.Join(dir, "clock.json")), CheckFail, "not set"},
		{"clock, no mark", checkClock(time.Now(), filepath.Join(dir, "clock.json")), CheckOK, "no saved agent time"},
	} {
		if tc.got.Status != tc.status || !strings.Contains(tc.got.Detail, tc.detail) {
			t.Errorf("%s: %s %q, want %s with %q", tc.name, tc.got.Status, tc.got.Detail, tc.status, tc.detail)
		}
	}
}

// TestCheckNATSSaysWhatKeepListTheNodeHas: the nats line reads the fleet
// keep list as the agent does, on Debian's 2.9.10 too; without NATS and
// without a saved list it says image deletes wait for one at start.
func TestCheckNATSSaysWhatKeepListTheNodeHas(t *testing.T) {
	debian := testenv.StartDebianNATS(t, testenv.DebianNATSOptions{})
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: debian.URL, Node: "op"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	kv, err := natsbus.EnsureKeepBucket(ctx, js, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsbus.EditKeep(ctx, kv, natsbus.KeepClusterKey("prod"), "op", time.Now, func([]string) ([]string, error) {
		return []string{"registry.example/app:*"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	noBucket := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	for _, tc := range []struct {
		name, url, status, detail string
	}{
		{"debian 2.9.10 with a list", debian.URL, CheckOK, "server 2.9.10); fleet keep list: 1 patterns for cluster prod (registry.example/app:*); no list saved"},
		{"no bucket", noBucket.ClientURL(), CheckOK, "fleet keep list: none (no bucket gcagent_keep)"},
		{"NATS refused", "nats://127.0.0.1:" + fmt.Sprint(freePort(t)), CheckFail,
			"fleet keep list: not read (NATS does not answer), no list saved in "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NATSURL, cfg.Cluster, cfg.StateDir = tc.url, "prod", t.TempDir()
			r := checkNATS(ctx, cfg)
			if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s %s, want %s with %q", r.Status, r.Detail, tc.status, tc.detail)
			}
			if tc.name == "NATS refused" && !strings.Contains(r.Detail, "wait for it up to --keep-list-wait 5m0s at start, then go on with --keep-image only") {
				t.Errorf("does not say deletes wait: %s", r.Detail)
			}
			t.Logf("%s nats: %s", r.Status, r.Detail)
		})
	}
}

// TestFirstStartKeepList: `gcagent plan` without a running agent plans
// with the list the agent saved; without one, with what NATS gives (on
// Debian's 2.9.10 too) or none on the embedded server run would start;
// when NATS does not answer, with a list never read, as the agent would.
func TestFirstStartKeepList(t *testing.T) {
	debian := testenv.StartDebianNATS(t, testenv.DebianNATSOptions{})
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: debian.URL, Node: "op"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	kv, err := natsbus.EnsureKeepBucket(ctx, js, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsbus.EditKeep(ctx, kv, natsbus.KeepAllKey, "op", time.Now, func([]string) ([]string, error) { return []string{"base/*"}, nil }); err != nil {
		t.Fatal(err)
	}
	now := time.Now
	saved := t.TempDir()
	savedFrom := DefaultConfig()
	savedFrom.NATSURL = "nats://127.0.0.1:1"
	saveFleetKeepFrom(t, saved, keepSource(savedFrom), time.Now().Add(-time.Hour), "saved/*")
	elsewhere := t.TempDir()
	saveFleetKeep(t, elsewhere, time.Now().Add(-time.Hour), "elsewhere/*")
	for _, tc := range []struct {
		name, url, stateDir string
		state               gc.InputState
		patterns            []string
	}{
		{"saved", savedFrom.NATSURL, saved, gc.InputStale, []string{"saved/*"}},
		{"saved from another NATS", savedFrom.NATSURL, elsewhere, gc.InputUnknown, []string{"elsewhere/*"}},
		{"embedded", "", t.TempDir(), gc.InputKnown, nil},
		{"debian 2.9.10", debian.URL, t.TempDir(), gc.InputKnown, []string{"base/*"}},
		{"NATS refused", "nats://127.0.0.1:" + fmt.Sprint(freePort(t)), t.TempDir(), gc.InputUnknown, nil},
	} {
		cfg := DefaultConfig()
		cfg.NATSURL, cfg.StateDir = tc.url, tc.stateDir
		l, s := firstStartKeepList(ctx, cfg, now)
		if l.State != tc.state || !slices.Equal(l.Patterns, tc.patterns) {
			t.Errorf("%s: %+v (%s), want %s %v", tc.name, l, s.Source, tc.state, tc.patterns)
		}
		t.Logf("%s: %s %v; setting %s = %q (%s)", tc.name, l.State, l.Patterns, s.Name, s.Value, s.Source)
	}
}
