package logs

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/gc"
)

// TestContainerLogsAsTheKubelet (issue 34, item 5): a removed CRI
// container's log file, its rotated files and its legacy link go, as the
// kubelet's removeContainerLog removes them; the other attempts' files, a
// directory, another pod's files and anything reached through a link
// stay. A plan (Find) lists the same and removes nothing.
func TestContainerLogsAsTheKubelet(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods")}
	mkdirAll(t, cfg.LogDir)
	id := cid("e1")
	pod := filepath.Join(cfg.PodLogDir, "ns_web_u1")
	ctr := filepath.Join(pod, "app")
	gone := []string{"0.log", "0.log.20260101-000000", "0.log.20260101-000000.gz"}
	stay := []string{"1.log", "10.log", "1.log.20260101-000000.gz"}
	for _, name := range append(slices.Clone(gone), stay...) {
		writeFile(t, filepath.Join(ctr, name), strings.Repeat("x", 3000))
	}
	mkdirAll(t, filepath.Join(ctr, "0.log.d")) // a directory is never removed
	other := filepath.Join(cfg.PodLogDir, "ns_job_u2", "app", "0.log")
	writeFile(t, other, "another pod\n")
	link := filepath.Join(cfg.LogDir, "web_ns_app-"+id+".log")
	symlink(t, filepath.Join(ctr, "0.log"), link)
	otherLink := filepath.Join(cfg.LogDir, "web_ns_app-"+cid("e2")+".log")
	symlink(t, filepath.Join(ctr, "1.log"), otherLink)

	l, err := NewContainerLogs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := gc.ContainerLogRef{ID: id, LogPath: filepath.Join(ctr, "0.log"), PodUID: "u1", PodNamespace: "ns", PodName: "web", ContainerName: "app"}
	var want []string
	for _, name := range gone {
		want = append(want, filepath.Join(ctr, name))
	}
	found, err := l.FindContainerLogs(ref)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(found.Files), want) || found.Link != link || found.Bytes < 3*3000 {
		t.Errorf("found %+v, want files %q, link %s and their bytes", found, want, link)
	}
	for _, p := range append(want, link) {
		if !exists(p) {
			t.Fatalf("Find removed %s", p)
		}
	}
	removed, paths, err := l.RemoveContainerLogs(ref)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(removed.Files), want) || removed.Link != link || removed.Bytes != found.Bytes || removed.Path != ref.LogPath {
		t.Errorf("removed %+v, want what Find found: %+v", removed, found)
	}
	// Path by path, as log.removed says them (issue 40, item 7).
	var got []string
	var bytes int64
	for _, p := range paths {
		got = append(got, string(p.Kind)+" "+filepath.Join(p.Dir, p.Name))
		bytes += p.Bytes
		if p.Entries != 1 || (p.Dir != cfg.PodLogDir && p.Dir != cfg.LogDir) {
			t.Errorf("path %+v: want one entry of a configured dir", p)
		}
	}
	wantPaths := []string{"symlink " + link}
	for _, p := range want {
		wantPaths = append(wantPaths, "file "+p)
	}
	if !slices.Equal(sorted(got), sorted(wantPaths)) || bytes != removed.Bytes {
		t.Errorf("paths %q (%d bytes), want %q (%d bytes)", got, bytes, wantPaths, removed.Bytes)
	}
	for _, p := range append(want, link) {
		if exists(p) {
			t.Errorf("%s not removed", p)
		}
	}
	for _, name := range append(stay, "0.log.d") {
		if !exists(filepath.Join(ctr, name)) {
			t.Errorf("%s removed: not this attempt's", name)
		}
	}
	if !exists(other) || !exists(otherLink) {
		t.Error("another pod's log or another container's link removed")
	}
	// Again: nothing left, no error.
	if again, paths, err := l.RemoveContainerLogs(ref); err != nil || len(again.Files) != 0 || again.Link != "" || len(paths) != 0 {
		t.Errorf("second removal: %+v, %+v, %v; want nothing and no error", again, paths, err)
	}
}

// TestContainerLogsOnlyInThePodsDir: a log path CRI gives that lies
// outside the pod log dir, in another pod's dir, or behind a symlink is
// not followed: its files stay, and Kept says why.
func TestContainerLogsOnlyInThePodsDir(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), HostPodLogDir: "/var/log/pods"}
	mkdirAll(t, cfg.LogDir)
	outside := filepath.Join(base, "outside")
	writeFile(t, filepath.Join(outside, "0.log"), "not the pod's\n")
	writeFile(t, filepath.Join(cfg.PodLogDir, "ns_job_u2", "app", "0.log"), "another pod\n")
	mkdirAll(t, filepath.Join(cfg.PodLogDir, "ns_web_u1"))
	symlink(t, outside, filepath.Join(cfg.PodLogDir, "ns_web_u1", "app"))
	writeFile(t, filepath.Join(cfg.PodLogDir, "ns_db_u3", "app", "0.log"), "mapped\n")
	l, err := NewContainerLogs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, uid, path, kept string
		files                 []string
	}{
		{"outside the pod log dir", "u1", filepath.Join(outside, "0.log"), "log path outside the pod log dir", nil},
		{"in another pod's dir", "u1", "/var/log/pods/ns_job_u2/app/0.log", "log path not in the pod's own dir", nil},
		{"through a symlink", "u1", "/var/log/pods/ns_web_u1/app/0.log", filepath.Join(cfg.PodLogDir, "ns_web_u1", "app") + " is not a directory", nil},
		{"no log path", "u1", "", "no log path in CRI's status", nil},
		{"the host's path mapped", "u3", "/var/log/pods/ns_db_u3/app/0.log", "", []string{filepath.Join(cfg.PodLogDir, "ns_db_u3", "app", "0.log")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := l.RemoveContainerLogs(gc.ContainerLogRef{ID: cid("e1"), LogPath: tc.path, PodUID: tc.uid, PodNamespace: "ns", PodName: "web", ContainerName: "app"})
			if err != nil {
				t.Fatal(err)
			}
			if got.Kept != tc.kept || !slices.Equal(got.Files, tc.files) {
				t.Errorf("got %+v, want kept %q, files %q", got, tc.kept, tc.files)
			}
		})
	}
	for _, p := range []string{filepath.Join(outside, "0.log"), filepath.Join(cfg.PodLogDir, "ns_job_u2", "app", "0.log")} {
		if !exists(p) {
			t.Errorf("%s removed", p)
		}
	}
}

// TestContainerLogsFailureKeepsTheContainer: a log file that cannot be
// unlinked (immutable) is an error: the caller keeps the container, as the
// kubelet does, and retries.
func TestContainerLogsFailureKeepsTheContainer(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods")}
	mkdirAll(t, cfg.LogDir)
	ctr := filepath.Join(cfg.PodLogDir, "ns_web_u1", "app")
	writeFile(t, filepath.Join(ctr, "0.log"), "log\n")
	setImmutable(t, ctr, true)
	l, err := NewContainerLogs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = l.RemoveContainerLogs(gc.ContainerLogRef{ID: cid("e1"), LogPath: filepath.Join(ctr, "0.log"), PodUID: "u1", PodNamespace: "ns", PodName: "web", ContainerName: "app"})
	if err == nil {
		t.Error("an immutable log removed without an error")
	}
}

// TestLegacyLinkName: the kubelet's name, cut to 255 bytes.
func TestLegacyLinkName(t *testing.T) {
	ref := gc.ContainerLogRef{ID: cid("e1"), PodName: "web", PodNamespace: "ns", ContainerName: "app"}
	if got, _ := legacyLinkName(ref); got != "web_ns_app-"+cid("e1")+".log" {
		t.Errorf("name %q", got)
	}
	ref.PodName = strings.Repeat("p", 250)
	if got, _ := legacyLinkName(ref); len(got) != maxNameLen || !strings.HasSuffix(got, ".log") {
		t.Errorf("long name %q (%d bytes), want 255 ending in .log", got, len(got))
	}
	ref.ContainerName = "a/b"
	if _, ok := legacyLinkName(ref); ok {
		t.Error("a name with a slash")
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestLegacyLinkOnlyOfTheRemovedAttempt (issue 40, item 9): with pod,
// namespace and container names so long that the kubelet cuts the link
// name (at 251 bytes, before ".log") inside the container id, two
// attempts share one link name. Removing the old attempt removes its
// files but not the link when the link points at the live attempt's log;
// the live attempt's removal then takes it. On d7dd547 the link went
// with the old attempt, by name. A link without a log path to compare
// with stays too.
func TestLegacyLinkOnlyOfTheRemovedAttempt(t *testing.T) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods")}
	mkdirAll(t, cfg.LogDir)
	podName, ns, name := strings.Repeat("p", 120), strings.Repeat("n", 60), strings.Repeat("c", 60)
	ctr := filepath.Join(cfg.PodLogDir, ns+"_"+podName+"_u1", name)
	writeFile(t, filepath.Join(ctr, "0.log"), "attempt 0\n")
	writeFile(t, filepath.Join(ctr, "1.log"), "attempt 1\n")
	old, live := cid("abcdef0123"), cid("abcdef0124") // the same first 8 digits
	oldRef := gc.ContainerLogRef{ID: old, LogPath: filepath.Join(ctr, "0.log"), PodUID: "u1", PodNamespace: ns, PodName: podName, ContainerName: name}
	liveRef := oldRef
	liveRef.ID, liveRef.LogPath = live, filepath.Join(ctr, "1.log")
	oldName, _ := legacyLinkName(oldRef)
	liveName, _ := legacyLinkName(liveRef)
	if oldName != liveName {
		t.Fatalf("the names are not cut inside the id: %s, %s", oldName, liveName)
	}
	link := filepath.Join(cfg.LogDir, liveName)
	symlink(t, liveRef.LogPath, link) // the live attempt's
	l, err := NewContainerLogs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if found, err := l.FindContainerLogs(oldRef); err != nil || found.Link != "" {
		t.Errorf("a plan of the old attempt lists link %q (%v), want none: it points at the live attempt's log", found.Link, err)
	}
	removed, _, err := l.RemoveContainerLogs(oldRef)
	if err != nil {
		t.Fatal(err)
	}
	if removed.Link != "" || !exists(link) {
		t.Errorf("the old attempt's removal removed the live attempt's link (%+v)", removed)
	}
	if slices.Equal(removed.Files, []string{filepath.Join(ctr, "0.log")}) == false || exists(filepath.Join(ctr, "0.log")) {
		t.Errorf("the old attempt's files: removed %q", removed.Files)
	}
	noPath := liveRef
	noPath.LogPath = ""
	if got, _, err := l.RemoveContainerLogs(noPath); err != nil || got.Link != "" || !exists(link) {
		t.Errorf("without a log path: removed %+v, %v; want the link kept", got, err)
	}
	if got, _, err := l.RemoveContainerLogs(liveRef); err != nil || got.Link != link || exists(link) {
		t.Errorf("the live attempt's removal: %+v, %v; want its link removed", got, err)
	}
}
