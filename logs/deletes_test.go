package logs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
	"golang.org/x/sys/unix"
)

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (chattr +i).
const fsImmutableFL = 0x10

// setImmutable sets or clears the immutable attribute of path, as chattr
// +i and -i do: nobody, root included, can unlink an immutable file, nor
// an entry of an immutable directory. A removal fails there, really and
// every time, without any hook in the code. Set, it is cleared at cleanup
// (before the temp dir goes). It skips when the user or the file system
// cannot, except under CI=true where that is a failure.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil {
		if on {
			flags |= fsImmutableFL
		} else {
			flags &^= fsImmutableFL
		}
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags))
	}
	switch {
	case err == nil:
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP):
		if os.Getenv("CI") == "true" {
			t.Fatalf("chattr +i %s: %v: CI=true forbids skipping (run `make test` as root on ext4, xfs, btrfs or tmpfs)", path, err)
		}
		t.Skipf("chattr +i %s: %v (needs root and a file system with the attribute)", path, err)
	default:
		t.Fatalf("chattr %s: %v", path, err)
	}
	if on {
		t.Cleanup(func() {
			if exists(path) {
				setImmutable(t, path, false)
			}
		})
	}
}

// txDirs returns a config on new temp dirs with no grace, and a state
// where pod uid1 is gone and container cid("e") exited, and the live pod
// uid9's log dir shows the pod log dir is the watched containerd's.
func txDirs(t *testing.T) (Config, *fakeState) {
	base := t.TempDir()
	cfg := Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods")}
	mkdirAll(t, cfg.LogDir)
	mkdirAll(t, filepath.Join(cfg.PodLogDir, "ns_live_uid9"))
	st := newFakeState()
	st.setPod("uid1", fakePod{goneSince: t0})
	st.setPod("uid9", fakePod{alive: true})
	st.setLogDirs(filepath.Join(cfg.PodLogDir, "ns_live_uid9"))
	st.setContainer(cid("e"), false)
	return cfg, st
}

// TestRemovalIsItsTransaction: each removal is begun as an intent and its
// log.removed event is the transaction's commit: kind log, the path as
// subject, <kind>:<path> as key, the removal as data.
func TestRemovalIsItsTransaction(t *testing.T) {
	cfg, st := txDirs(t)
	pod := filepath.Join(cfg.PodLogDir, "ns_p_uid1")
	writeFile(t, filepath.Join(pod, "app", "0.log"), strings.Repeat("x", 5000))
	link := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("e")+".log")
	symlink(t, filepath.Join(pod, "app", "1.log"), link) // dangling
	deletes, bus := newDeletes(t, lstatChecker{})
	c, err := New(Deps{State: st, Deletes: deletes, Publisher: bus}, Options{Config: cfg, Clock: clock.System(func() time.Time { return t0 })})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clean(context.Background()); err != nil {
		t.Fatal(err)
	}
	if exists(link) || exists(pod) {
		t.Fatal("not removed")
	}
	if got, want := bus.journal(), []string{"intend " + pod, "complete " + pod, "intend " + link, "complete " + link}; !slices.Equal(got, want) {
		t.Errorf("journal %q, want %q", got, want)
	}
	acts := bus.all()
	if len(acts) != 2 {
		t.Fatalf("published %+v, want two log.removed", acts)
	}
	for i, want := range []struct {
		kind    Kind
		path    string
		entries int
	}{{KindPodDir, pod, 3}, {KindSymlink, link, 1}} {
		a := acts[i]
		r, _ := a.Data.(Removal)
		if a.Kind != schema.KindLog || a.Action != schema.ActionRemoved || a.Subject != want.path || a.Key != string(want.kind)+":"+want.path {
			t.Errorf("action %s.%s %q key %q, want log.removed %q key %q", a.Kind, a.Action, a.Subject, a.Key, want.path, string(want.kind)+":"+want.path)
		}
		if r.Kind != want.kind || filepath.Join(r.Dir, r.Name) != want.path || r.Namespace != "k8s.io" || r.Entries != want.entries || r.Partial || r.DryRun {
			t.Errorf("data %+v, want a complete %s removal of %s (%d entries) in k8s.io", r, want.kind, want.path, want.entries)
		}
	}
	if r := acts[0].Data.(Removal); r.Bytes < 5000 {
		t.Errorf("pod dir removal of %d bytes, want >= 5000", r.Bytes)
	}
}

// TestPartialPodDirRemovalIsReported: finding 10. A pod dir whose removal
// fails partway (one log file is immutable, chattr +i: even root cannot
// unlink it) is reported with what went: its transaction is committed as a
// partial removal with the bytes and entries removed and the error, never
// abandoned. The next pass, which can remove nothing more, records no
// removal; once the file may go, the rest goes as a removal of its own.
func TestPartialPodDirRemovalIsReported(t *testing.T) {
	cfg, st := txDirs(t)
	pod := filepath.Join(cfg.PodLogDir, "ns_p_uid1")
	writeFile(t, filepath.Join(pod, "app", "0.log"), strings.Repeat("a", 8192))
	writeFile(t, filepath.Join(pod, "app", "1.log"), strings.Repeat("b", 8192))
	writeFile(t, filepath.Join(pod, "init", "0.log"), strings.Repeat("c", 8192))
	stuck := filepath.Join(pod, "app", "2.log")
	writeFile(t, stuck, "stuck\n")
	setImmutable(t, stuck, true)
	deletes, bus := newDeletes(t, lstatChecker{})
	c, err := New(Deps{State: st, Deletes: deletes, Publisher: bus}, Options{Config: cfg, Clock: clock.System(func() time.Time { return t0 })})
	if err != nil {
		t.Fatal(err)
	}

	_, err = c.Clean(context.Background())
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "removed in part") {
		t.Errorf("pass error %v, want the removal's EPERM, removed in part", err)
	}
	if !exists(stuck) || exists(filepath.Join(pod, "app", "0.log")) || exists(filepath.Join(pod, "init")) {
		t.Fatal("want everything but the immutable file and its parents removed")
	}
	if got, want := bus.journal(), []string{"intend " + pod, "complete " + pod}; !slices.Equal(got, want) {
		t.Errorf("journal %q, want %q", got, want)
	}
	rs := bus.removals()
	if len(rs) != 1 {
		t.Fatalf("removals %+v, want one", rs)
	}
	// Removed: app/0.log, app/1.log, init/0.log, init.
	if r := rs[0]; !r.Partial || !strings.Contains(r.Error, "operation not permitted") || r.Entries != 4 || r.Bytes < 3*8192 {
		t.Errorf("removal %+v, want partial, 4 entries, >= 24 KiB and the EPERM", r)
	}

	// Nothing more can go: the intent is aborted, no second event.
	if _, err := c.Clean(context.Background()); !errors.Is(err, unix.EPERM) {
		t.Errorf("second pass error %v, want EPERM", err)
	}
	if got, want := bus.journal()[2:], []string{"intend " + pod, "abandon " + pod}; !slices.Equal(got, want) {
		t.Errorf("second pass journal %q, want %q", got, want)
	}
	if n := len(bus.removals()); n != 1 {
		t.Errorf("%d removals after a pass that removed nothing, want 1", n)
	}

	setImmutable(t, stuck, false)
	if _, err := c.Clean(context.Background()); err != nil {
		t.Fatal(err)
	}
	if exists(pod) {
		t.Fatal("pod dir left once it could go")
	}
	rs = bus.removals()
	if len(rs) != 2 || rs[1].Partial || rs[1].Entries != 3 {
		t.Errorf("removals %+v, want a second, complete one of 3 entries (app/2.log, app, the pod dir)", rs)
	}
}

// TestFailedRemovalIsAbortedOrSettled: a removal that fails without
// removing anything (the log dir is immutable: the link cannot be
// unlinked) is settled against the path: still there, its intent is
// aborted; when the node cannot say, it stays pending and no other removal
// begins until it can.
func TestFailedRemovalIsAbortedOrSettled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		checker *lstatChecker
	}{
		{"path still there: aborted", &lstatChecker{}},
		{"node cannot say: pending", &lstatChecker{err: errors.New("lstat: input/output error")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, st := txDirs(t)
			writeFile(t, filepath.Join(cfg.PodLogDir, "ns_q_uid2", "app", "0.log"), "live pod\n")
			st.setPod("uid2", fakePod{alive: true})
			link := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("e")+".log")
			symlink(t, filepath.Join(cfg.PodLogDir, "ns_q_uid2", "app", "gone.log"), link)
			setImmutable(t, cfg.LogDir, true)
			bus := &fakeBus{}
			deletes, err := deletion.New(deletion.Deps{Journal: bus, Checker: tc.checker}, deletion.Options{RetryGap: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
			c, err := New(Deps{State: st, Deletes: deletes, Publisher: bus}, Options{Config: cfg, Clock: clock.System(func() time.Time { return t0 })})
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Clean(context.Background())
			if !errors.Is(err, unix.EPERM) {
				t.Errorf("pass error %v, want EPERM", err)
			}
			if !exists(link) || len(bus.all()) != 0 {
				t.Fatalf("link gone %v, published %+v: want the link kept and nothing published", !exists(link), bus.all())
			}
			if tc.checker.err == nil {
				if got, want := bus.journal(), []string{"intend " + link, "abandon " + link}; !slices.Equal(got, want) || deletes.Unsettled() != 0 {
					t.Errorf("journal %q, %d unsettled: want %q, none", got, deletes.Unsettled(), want)
				}
				return
			}
			if got, want := bus.journal(), []string{"intend " + link}; !slices.Equal(got, want) || deletes.Unsettled() != 1 {
				t.Errorf("journal %q, %d unsettled: want %q, one", got, deletes.Unsettled(), want)
			}
			if !strings.Contains(err.Error(), "outcome unknown") {
				t.Errorf("pass error %v, want outcome unknown", err)
			}
			// Until the node can say, nothing else may begin.
			if _, err := c.Clean(context.Background()); !errors.Is(err, deletion.ErrUnsettled) {
				t.Errorf("next pass error %v, want ErrUnsettled", err)
			}
			tc.checker.err = nil
			if _, err := c.Clean(context.Background()); !errors.Is(err, unix.EPERM) {
				t.Errorf("pass once the node answers: %v, want the removal's EPERM again", err)
			}
			if got := bus.journal(); len(got) < 2 || got[1] != "abandon "+link || deletes.Unsettled() != 0 {
				t.Errorf("journal %q, %d unsettled: want the pending intent abandoned (the link is there)", got, deletes.Unsettled())
			}
		})
	}
}
