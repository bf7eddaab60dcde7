package logs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"golang.org/x/sys/unix"
)

var _ gc.PodLogDir = (*PodDirs)(nil)

// TestPodDirsSeenThenGone: a pod's dir counts as gone only once it was
// seen and a later read of the same directory no longer holds it; a dir
// never seen is no sign, whatever the reads say.
func TestPodDirsSeenThenGone(t *testing.T) {
	dir := t.TempDir()
	mkdirAll(t, filepath.Join(dir, "ns_web_u1"))
	mkdirAll(t, filepath.Join(dir, "ns_job_u2"))
	d := NewPodDirs("")
	if in := d.Input(t0); in.State != gc.InputUnknown {
		t.Fatalf("before any read: %+v, want unknown", in)
	}
	d.Read(dir, t0)
	if in := d.Input(t0); !in.Known() {
		t.Fatalf("after a read: %+v, want known", in)
	}
	if err := os.Remove(filepath.Join(dir, "ns_job_u2")); err != nil {
		t.Fatal(err)
	}
	d.Read(dir, t0.Add(time.Second))
	if since, gone := d.Gone("u2", "ns", "job"); !gone || !since.Equal(t0.Add(time.Second)) {
		t.Errorf("seen, then gone: gone %v since %v, want since the read without it", gone, since)
	}
	if _, gone := d.Gone("u1", "ns", "web"); gone {
		t.Error("a dir that is there counts as gone")
	}
	if _, gone := d.Gone("u3", "ns", "never"); gone {
		t.Error("a dir never seen counts as gone")
	}
	// A read later does not move the time it went; its return clears it.
	d.Read(dir, t0.Add(time.Minute))
	if since, _ := d.Gone("u2", "ns", "job"); !since.Equal(t0.Add(time.Second)) {
		t.Errorf("gone since %v after another read, want %v", since, t0.Add(time.Second))
	}
	mkdirAll(t, filepath.Join(dir, "ns_job_u2"))
	d.Read(dir, t0.Add(2*time.Minute))
	if _, gone := d.Gone("u2", "ns", "job"); gone {
		t.Error("a dir that came back counts as gone")
	}
}

// TestPodDirsAbsenceIsNoSign: the reads that say nothing: a pod log dir
// that is another directory than the one the dirs were seen in (a mount
// gone, a dir swapped), one that is missing or unreadable, one not read
// for long (stale). None makes a dir seen before count as gone.
func TestPodDirsAbsenceIsNoSign(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "pods")
	mkdirAll(t, filepath.Join(dir, "ns_web_u1"))
	d := NewPodDirs("")
	d.Read(dir, t0)

	// Missing: the input is stale, nothing is gone.
	if err := os.Rename(dir, filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	d.Read(dir, t0.Add(time.Second))
	if in := d.Input(t0.Add(time.Second)); in.State != gc.InputStale || in.Cause != "missing" {
		t.Errorf("pod log dir missing: %+v, want stale, missing", in)
	}
	if _, gone := d.Gone("u1", "ns", "web"); gone {
		t.Error("missing pod log dir: its pods count as gone")
	}
	// Another directory at that path (an empty one, as a hostPath or an
	// unmounted mount point leaves): no evidence of the dirs seen before.
	mkdirAll(t, dir)
	d.Read(dir, t0.Add(2*time.Second))
	if _, gone := d.Gone("u1", "ns", "web"); gone {
		t.Error("another, empty directory at the pod log dir's path: its pods count as gone")
	}
	if in := d.Input(t0.Add(2 * time.Second)); !in.Known() {
		t.Errorf("read: %+v, want known", in)
	}
	// Stale: read, but not for longer than PodDirsStaleAfter.
	if in := d.Input(t0.Add(2*time.Second + PodDirsStaleAfter + time.Second)); in.State != gc.InputStale {
		t.Errorf("not read for %s: %+v, want stale", PodDirsStaleAfter, in)
	}
}

// TestPodDirsKeptAcrossRestarts: what was seen is saved, so a dir seen
// before a restart and missing after counts as gone from the first read
// after it; a lost or corrupt file is no evidence at all.
func TestPodDirsKeptAcrossRestarts(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "pods")
	mkdirAll(t, filepath.Join(dir, "ns_web_u1"))
	mkdirAll(t, filepath.Join(dir, "ns_job_u2"))
	file := filepath.Join(base, PodDirsFile)
	d, err := LoadPodDirs(file)
	if err != nil {
		t.Fatal(err)
	}
	d.Read(dir, t0)
	if err := d.Save(); err != nil {
		t.Fatal(err)
	}
	// The agent is away; the kubelet deletes the pod.
	if err := os.Remove(filepath.Join(dir, "ns_job_u2")); err != nil {
		t.Fatal(err)
	}
	restarted, err := LoadPodDirs(file)
	if err != nil {
		t.Fatal(err)
	}
	if in := restarted.Input(t0); in.State != gc.InputUnknown {
		t.Errorf("restored, not read yet: %+v, want unknown", in)
	}
	restarted.Read(dir, t0.Add(time.Hour))
	if since, gone := restarted.Gone("u2", "ns", "job"); !gone || !since.Equal(t0.Add(time.Hour)) {
		t.Errorf("seen before the restart, missing after: gone %v since %v, want since the first read after", gone, since)
	}
	there, _ := restarted.Seen()
	if !slices.Equal(there, []string{"ns_web_u1"}) {
		t.Errorf("there %q, want ns_web_u1", there)
	}

	for name, corrupt := range map[string]func(){
		"lost":    func() { _ = os.Remove(file) },
		"corrupt": func() { _ = os.WriteFile(file, []byte("{not json"), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			corrupt()
			d, err := LoadPodDirs(file)
			if name == "corrupt" && err == nil {
				t.Error("a corrupt file loads without an error")
			}
			d.Read(dir, t0.Add(2*time.Hour))
			if _, gone := d.Gone("u2", "ns", "job"); gone {
				t.Errorf("state %s: a dir never seen since counts as gone", name)
			}
		})
	}
}

// replaceWithSameInode removes dir and makes it again, empty, until the
// new directory has the old one's device and inode (a filesystem that
// reuses a freed inode at once, as ext4 and xfs do, and a tmpfs mounted
// again at boot does): the other directory that rm -rf and mkdir, or a
// reboot, leave at the path, which dev and inode alone do not tell from
// the first. It reports whether the filesystem gave the inode again: on a
// busy machine another process may take it first, every time.
func replaceWithSameInode(t *testing.T, dir string) bool {
	t.Helper()
	var old unix.Stat_t
	if err := unix.Stat(dir, &old); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		mkdirAll(t, dir)
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Dev == old.Dev && st.Ino == old.Ino {
			return true
		}
	}
	return false
}

// readDirID is dirID of the directory at path.
func readDirID(t *testing.T, path string) DirID {
	t.Helper()
	fd, err := openRoot(path)
	if err != nil || fd < 0 {
		t.Fatalf("open %s: %v", path, err)
	}
	defer unix.Close(fd)
	id, err := dirID(fd)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPodDirsRootReplacedWithTheSameInode: the pod log dir replaced by
// another, empty directory that has the first one's device and inode (rm
// -rf and mkdir on ext4; a tmpfs made again at boot) is another directory:
// the pod dirs seen in the first are not gone, whether the agent runs
// through the swap or restarts across it (poddirs.json from before).
// dev and inode alone took the new dir for the old one, and every pod
// seen counted as deleted.
func TestPodDirsRootReplacedWithTheSameInode(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "pods")
			mkdirAll(t, filepath.Join(dir, "ns_web_u1"))
			file := filepath.Join(base, PodDirsFile)
			d, err := LoadPodDirs(file)
			if err != nil {
				t.Fatal(err)
			}
			d.Read(dir, t0)
			if err := d.Save(); err != nil {
				t.Fatal(err)
			}
			first := readDirID(t, dir)
			reused := replaceWithSameInode(t, dir)
			if restart {
				if d, err = LoadPodDirs(file); err != nil {
					t.Fatal(err)
				}
			}
			if reused {
				d.Read(dir, t0.Add(time.Minute))
			} else {
				// The filesystem gave another inode this time: the read of
				// the new, empty dir is made with the first one's device
				// and inode, as ext4 gives them when nothing else runs.
				id := readDirID(t, dir)
				id.Dev, id.Ino = first.Dev, first.Ino
				t.Logf("no inode reused in 200 tries: the new dir read as %s (the first: %s)", id, first)
				d.observe(id, nil, nil, t0.Add(time.Minute))
			}
			if since, gone := d.Gone("u1", "ns", "web"); gone {
				t.Errorf("the pod log dir replaced by an empty one with the same inode: pod u1 counts as gone since %s", since)
			}
			// The same directory read again is still the same: a pod dir
			// that goes from it is gone.
			mkdirAll(t, filepath.Join(dir, "ns_job_u2"))
			d.Read(dir, t0.Add(2*time.Minute))
			if err := os.Remove(filepath.Join(dir, "ns_job_u2")); err != nil {
				t.Fatal(err)
			}
			d.Read(dir, t0.Add(3*time.Minute))
			if _, gone := d.Gone("u2", "ns", "job"); !gone {
				t.Error("a pod dir seen, then removed from the same directory, does not count as gone")
			}
		})
	}
}
