package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
)

func TestCheckJudges(t *testing.T) {
	dir := t.TempDir()
	pods := filepath.Join(dir, "pods")
	if err := os.Mkdir(pods, 0o755); err != nil {
		t.Fatal(err)
	}
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
	running := nodeFacts{pods: []string{"default_web_uid-1"}}
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
		{"log dir missing", checkLogDir("log-dir", filepath.Join(dir, "none"), "links", nodeFacts{}), CheckWarn, "does not exist"},
		{"log dir a file", checkLogDir("log-dir", file, "links", nodeFacts{}), CheckFail, "not a directory"},
		{"pod log dir empty, no pods", checkLogDir("pod-log-dir", pods, "dirs", nodeFacts{}), CheckOK, "0 entries"},
		{"pod log dir empty, pods run", checkLogDir("pod-log-dir", pods, "dirs", running), CheckWarn, "default_web_uid-1"},
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
