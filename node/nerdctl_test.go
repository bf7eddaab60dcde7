package node

// The trees these tests build follow FIELD-2026 §5 (nerdctl's
// pkg/namestore, pkg/dnsutil/hostsstore, pkg/cmd/container/remove.go and
// the labels of pkg/cmd/container/create.go): nerdctl is not available
// where they were written, so no tree here was made by nerdctl itself.

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	ncNS      = "default"
	ncStore   = "1935db59" // the store of nerdctl#499
	ncID      = "3f2a9c0e7d1b4a5f8e6c2b0a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e"
	ncOtherID = "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c"
)

// ncFixture is a nerdctl data root with two containers of namespace
// default, web (ncID, the one cleaned) and db (ncOtherID), and a volume.
type ncFixture struct {
	root    string // the data root
	store   string // root/ncStore
	outside string // a directory beside the data root, never to be touched
	labels  map[string]string
}

func newNCFixture(t *testing.T) ncFixture {
	t.Helper()
	base := t.TempDir()
	f := ncFixture{root: filepath.Join(base, "nerdctl"), outside: filepath.Join(base, "elsewhere")}
	f.store = filepath.Join(f.root, ncStore)
	ncWrite(t, f.store, "names/default/web", ncID)
	ncWrite(t, f.store, "names/default/db", ncOtherID)
	for _, id := range []string{ncID, ncOtherID} {
		ncWrite(t, f.store, "etchosts/default/"+id+"/hosts", "127.0.0.1 localhost\n")
		ncWrite(t, f.store, "etchosts/default/"+id+"/meta.json", `{"ID":"`+id+`"}`)
		ncWrite(t, f.store, "containers/default/"+id+"/"+id+"-json.log", `{"log":"hi\n","stream":"stdout"}`+"\n")
		ncWrite(t, f.store, "containers/default/"+id+"/log-config.json", `{"driver":"json-file"}`)
		ncWrite(t, f.store, "containers/default/"+id+"/resolv.conf", "nameserver 10.4.0.1\n")
		ncWrite(t, f.store, "containers/default/"+id+"/logger-lock", "")
	}
	ncWrite(t, f.store, "volumes/default/v1/_data/keep.txt", "volume data")
	// What a symlink out of the data store would reach: the same shapes.
	ncWrite(t, f.outside, "victim.txt", "outside")
	ncWrite(t, f.outside, "containers/default/"+ncID+"/victim.txt", "outside")
	ncWrite(t, f.outside, "etchosts/"+ncID+"/hosts", "outside")
	ncWrite(t, f.outside, "name", ncID)
	ncWrite(t, f.outside, ncStore+"/containers/default/"+ncID+"/victim.txt", "outside")
	f.labels = map[string]string{
		"nerdctl/namespace":  ncNS,
		"nerdctl/name":       "web",
		"nerdctl/hostname":   ncID[:12],
		"nerdctl/extraHosts": "null",
		"nerdctl/networks":   `["bridge"]`,
		"nerdctl/state-dir":  filepath.Join(f.store, "containers", ncNS, ncID),
		"nerdctl/log-uri":    "binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=" + f.root,
	}
	return f
}

func (f ncFixture) nerdctl() Nerdctl { return Nerdctl{DataRoot: f.root} }

// ncWrite writes content to dir/rel, making its parents.
func ncWrite(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ncTree describes every entry under dir without following symlinks: a
// directory as "dir", a file by its content, a symlink by its target.
func ncTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			tree[rel] = "link:" + target
			return err
		case d.IsDir():
			tree[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			tree[rel] = "file:" + string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// ncWithout returns tree without the entries at or below the given paths.
func ncWithout(tree map[string]string, gone ...string) map[string]string {
	out := map[string]string{}
next:
	for rel, v := range tree {
		for _, g := range gone {
			if rel == g || strings.HasPrefix(rel, g+"/") {
				continue next
			}
		}
		out[rel] = v
	}
	return out
}

// ncSameTree fails the test with the entries that differ.
func ncSameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for rel, w := range want {
		if g, ok := got[rel]; !ok {
			t.Errorf("%s: %s is gone (was %.40q)", what, rel, w)
		} else if g != w {
			t.Errorf("%s: %s is %.40q, want %.40q", what, rel, g, w)
		}
	}
	for rel, g := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: %s appeared (%.40q)", what, rel, g)
		}
	}
}

func TestNerdctlCleanupRemovesWhatRmRemoves(t *testing.T) {
	f := newNCFixture(t)
	before := ncTree(t, f.root)

	c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	want := []string{
		filepath.Join(f.store, "names", ncNS, "web"),
		filepath.Join(f.store, "etchosts", ncNS, ncID),
		filepath.Join(f.store, "containers", ncNS, ncID),
	}
	if !reflect.DeepEqual(c.Removed, want) {
		t.Errorf("Removed = %q, want %q", c.Removed, want)
	}
	if c.Bytes <= 0 {
		t.Errorf("Bytes = %d, want the blocks of the files removed", c.Bytes)
	}
	if c.NameHeldBy != "" {
		t.Errorf("NameHeldBy = %q, want empty", c.NameHeldBy)
	}
	// Exactly those three are gone: the other container's lock, hosts and
	// state dir, the volume, and the namespace dirs stay.
	s := ncStore + "/"
	ncSameTree(t, "data root", ncTree(t, f.root), ncWithout(before,
		s+"names/default/web", s+"etchosts/default/"+ncID, s+"containers/default/"+ncID))
	for _, keep := range []string{
		"names/default/db", "etchosts/default/" + ncOtherID + "/hosts",
		"containers/default/" + ncOtherID + "/" + ncOtherID + "-json.log",
		"volumes/default/v1/_data/keep.txt", "names/default", "etchosts/default", "containers/default",
	} {
		if _, err := os.Lstat(filepath.Join(f.store, keep)); err != nil {
			t.Errorf("%s: %v", keep, err)
		}
	}
}

func TestNerdctlCleanupNameLock(t *testing.T) {
	for _, tc := range []struct {
		name     string
		content  string
		released bool
		heldBy   string
	}{
		{"holds the id", ncID, true, ""},
		{"holds the id and a newline", ncID + "\n", true, ""}, // nerdctl's Release trims
		{"holds another id", ncOtherID, false, ncOtherID},
		{"holds a prefix of the id", ncID[:12], false, ncID[:12]},
		{"is empty", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNCFixture(t)
			lock := filepath.Join(f.store, "names", ncNS, "web")
			ncWrite(t, f.store, "names/default/web", tc.content)

			c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
			if err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			want := []string{filepath.Join(f.store, "etchosts", ncNS, ncID), filepath.Join(f.store, "containers", ncNS, ncID)}
			if tc.released {
				want = append([]string{lock}, want...)
			}
			if !reflect.DeepEqual(c.Removed, want) {
				t.Errorf("Removed = %q, want %q", c.Removed, want)
			}
			if c.NameHeldBy != tc.heldBy {
				t.Errorf("NameHeldBy = %q, want %q", c.NameHeldBy, tc.heldBy)
			}
			b, err := os.ReadFile(lock)
			switch {
			case tc.released && !errors.Is(err, fs.ErrNotExist):
				t.Errorf("name lock still there (%v)", err)
			case !tc.released && (err != nil || string(b) != tc.content):
				t.Errorf("name lock = %q, %v; want %q kept", b, err, tc.content)
			}
		})
	}
}

func TestNerdctlCleanupRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lexical: Check refuses it from the labels alone.
		lexical bool
		setup   func(t *testing.T, f *ncFixture, n *Nerdctl)
		why     string // in the error
	}{
		{"state dir /etc", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = "/etc"
		}, "not under the data root"},
		{"state dir with ../..", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.store, "containers", ncNS, ncID) + "/../../../../elsewhere/containers/default/" + ncID
		}, "has a .. element"},
		{"state dir that cleans to itself through ..", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.store, "containers", ncNS) + "/../" + ncNS + "/" + ncID
		}, "has a .. element"},
		{"relative state dir", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = ncStore + "/containers/default/" + ncID
		}, "not absolute"},
		{"same layout beside the data root", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.outside, ncStore, "containers", ncNS, ncID)
		}, "not under the data root"},
		{"data root one level too high", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			n.DataRoot = filepath.Dir(f.root)
		}, "not <data root>/<store>/containers/<namespace>/<id>"},
		{"store not 8 hex", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncWrite(t, f.root, "volumes1/containers/default/"+ncID+"/x", "x")
			f.labels["nerdctl/state-dir"] = filepath.Join(f.root, "volumes1", "containers", ncNS, ncID)
		}, "not 8 hex digits"},
		{"the store dir itself", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = f.store
		}, "not <data root>/<store>/containers/<namespace>/<id>"},
		{"another container's state dir", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.store, "containers", ncNS, ncOtherID)
		}, "not that of this namespace and id"},
		{"another namespace's state dir", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.store, "containers", "k8s.io", ncID)
		}, "not that of this namespace and id"},
		{"the volumes dir", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/state-dir"] = filepath.Join(f.store, "volumes", ncNS, ncID)
		}, "not <data root>/<store>/containers/<namespace>/<id>"},
		{"namespace label of another namespace", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/namespace"] = "k8s.io"
		}, "label nerdctl/namespace"},
		{"name with a slash", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			f.labels["nerdctl/name"] = "../../../elsewhere/name"
		}, "not a single path element"},
		{"relative data root", true, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			n.DataRoot = "var/lib/nerdctl"
		}, "not absolute"},
		{"state dir a symlink into another tree", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "containers", ncNS, ncID), filepath.Join(f.store, "containers", ncNS, ncID))
		}, "is a symlink"},
		{"namespace dir of containers a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "containers", ncNS), filepath.Join(f.store, "containers", ncNS))
		}, "is a symlink"},
		{"containers dir a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "containers"), filepath.Join(f.store, "containers"))
		}, "is a symlink"},
		{"store a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, ncStore), f.store)
		}, "is a symlink"},
		{"store a symlink within the data root", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			if err := os.Rename(f.store, filepath.Join(f.root, "real")); err != nil {
				t.Fatal(err)
			}
			ncSymlink(t, "real", f.store)
		}, "is a symlink"},
		{"hosts dir a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "etchosts", ncID), filepath.Join(f.store, "etchosts", ncNS, ncID))
		}, "is a symlink"},
		{"etchosts a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "etchosts"), filepath.Join(f.store, "etchosts"))
		}, "is a symlink"},
		{"name lock a symlink to a file holding the id", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, filepath.Join(f.outside, "name"), filepath.Join(f.store, "names", ncNS, "web"))
		}, "not a regular file"},
		{"names namespace dir a symlink", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			ncSymlink(t, f.outside, filepath.Join(f.store, "names", ncNS))
		}, "is a symlink"},
		{"state dir a file", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			p := filepath.Join(f.store, "containers", ncNS, ncID)
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			ncWrite(t, f.store, "containers/default/"+ncID, "x")
		}, "is not a directory"},
		{"name lock a directory", false, func(t *testing.T, f *ncFixture, n *Nerdctl) {
			p := filepath.Join(f.store, "names", ncNS, "web")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			ncWrite(t, f.store, "names/default/web/x", ncID)
		}, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNCFixture(t)
			n := f.nerdctl()
			tc.setup(t, &f, &n)
			base := filepath.Dir(f.root)
			before := ncTree(t, base)

			err := n.Check(ncNS, ncID, f.labels)
			if tc.lexical != (err != nil) {
				t.Errorf("Check = %v, want an error: %v", err, tc.lexical)
			}
			c, err := n.Cleanup(context.Background(), ncNS, ncID, f.labels)
			if !errors.Is(err, ErrNerdctlLayout) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("Cleanup error = %v, want %q wrapping ErrNerdctlLayout", err, tc.why)
			}
			if !reflect.DeepEqual(c, NerdctlCleaned{}) {
				t.Errorf("Cleaned = %+v, want zero", c)
			}
			ncSameTree(t, "after a refusal", ncTree(t, base), before)
		})
	}
}

// ncSymlink replaces link (whatever is there) with a symlink to target.
func ncSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.RemoveAll(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestNerdctlCleanupIsIdempotent(t *testing.T) {
	f := newNCFixture(t)
	// The hosts dir is already gone (a second nerdctl rm, or never made).
	if err := os.RemoveAll(filepath.Join(f.store, "etchosts", ncNS, ncID)); err != nil {
		t.Fatal(err)
	}
	c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	want := []string{filepath.Join(f.store, "names", ncNS, "web"), filepath.Join(f.store, "containers", ncNS, ncID)}
	if !reflect.DeepEqual(c.Removed, want) {
		t.Errorf("Removed = %q, want %q", c.Removed, want)
	}
	before := ncTree(t, f.root)
	c, err = f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if err != nil || !reflect.DeepEqual(c, NerdctlCleaned{}) {
		t.Errorf("second Cleanup = %+v, %v; want zero, nil", c, err)
	}
	ncSameTree(t, "after a second Cleanup", ncTree(t, f.root), before)

	// Nothing of the namespace at all: nothing to do either.
	for _, d := range []string{"names", "etchosts", "containers"} {
		if err := os.RemoveAll(filepath.Join(f.store, d)); err != nil {
			t.Fatal(err)
		}
	}
	c, err = f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if err != nil || !reflect.DeepEqual(c, NerdctlCleaned{}) {
		t.Errorf("Cleanup of an empty store = %+v, %v; want zero, nil", c, err)
	}
}

func TestNerdctlCleanupWithoutStateDirTouchesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels func(f ncFixture) map[string]string
	}{
		{"no labels", func(ncFixture) map[string]string { return nil }},
		{"nerdctl labels but no state dir", func(f ncFixture) map[string]string {
			l := map[string]string{}
			for k, v := range f.labels {
				l[k] = v
			}
			delete(l, "nerdctl/state-dir")
			return l
		}},
		{"a CRI container", func(ncFixture) map[string]string {
			return map[string]string{"io.cri-containerd.kind": "container", "io.kubernetes.pod.name": "web"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNCFixture(t)
			before := ncTree(t, f.root)
			labels := tc.labels(f)
			if err := f.nerdctl().Check(ncNS, ncID, labels); err != nil {
				t.Errorf("Check: %v", err)
			}
			c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, labels)
			if err != nil || !reflect.DeepEqual(c, NerdctlCleaned{}) {
				t.Errorf("Cleanup = %+v, %v; want zero, nil", c, err)
			}
			ncSameTree(t, "data root", ncTree(t, f.root), before)
		})
	}
}

func TestNerdctlCleanupMissingStoreIsAnError(t *testing.T) {
	f := newNCFixture(t)
	// The data root is not the one nerdctl used, or is not mounted here.
	if err := os.RemoveAll(f.store); err != nil {
		t.Fatal(err)
	}
	c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if err == nil || errors.Is(err, ErrNerdctlLayout) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Cleanup error = %v, want the store named as missing", err)
	}
	if !reflect.DeepEqual(c, NerdctlCleaned{}) {
		t.Errorf("Cleaned = %+v, want zero", c)
	}
}

func TestNerdctlCleanupRefusesMountPoint(t *testing.T) {
	f := newNCFixture(t)
	// nerdctl --ipc=shareable mounts a tmpfs at <state dir>/shm.
	shm := filepath.Join(f.store, "containers", ncNS, ncID, "shm")
	if err := os.Mkdir(shm, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(shm, unix.MNT_DETACH) })
	ncWrite(t, shm, "segment", "shared memory")
	before := ncTree(t, f.root)

	c, err := f.nerdctl().Cleanup(context.Background(), ncNS, ncID, f.labels)
	if !errors.Is(err, ErrNerdctlLayout) || !strings.Contains(err.Error(), "is a mount point") {
		t.Errorf("Cleanup error = %v, want a mount point refused", err)
	}
	if !reflect.DeepEqual(c, NerdctlCleaned{}) {
		t.Errorf("Cleaned = %+v, want zero", c)
	}
	ncSameTree(t, "after a refusal", ncTree(t, f.root), before)
}

func TestNerdctlCleanupTakesNerdctlLocks(t *testing.T) {
	for _, dir := range []string{"names/default", "etchosts"} {
		t.Run(dir, func(t *testing.T) {
			f := newNCFixture(t)
			held, err := os.Open(filepath.Join(f.store, dir))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			// As nerdctl's lockutil.WithDirLock holds it.
			if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}

			// While nerdctl holds it, that step waits, then gives up with ctx.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			c, err := f.nerdctl().Cleanup(ctx, ncNS, ncID, f.labels)
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), filepath.Join(f.store, dir)) {
				t.Errorf("Cleanup error = %v, want the lock of %s given up", err, dir)
			}
			for _, p := range c.Removed {
				if strings.HasPrefix(p, filepath.Join(f.store, strings.Split(dir, "/")[0])+"/") {
					t.Errorf("removed %s while nerdctl held the lock", p)
				}
			}

			// Once nerdctl lets go, a waiting Cleanup goes on.
			f2 := newNCFixture(t)
			held2, err := os.Open(filepath.Join(f2.store, dir))
			if err != nil {
				t.Fatal(err)
			}
			defer held2.Close()
			if err := unix.Flock(int(held2.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			type result struct {
				c   NerdctlCleaned
				err error
			}
			done := make(chan result, 1)
			go func() {
				c, err := f2.nerdctl().Cleanup(context.Background(), ncNS, ncID, f2.labels)
				done <- result{c, err}
			}()
			if err := unix.Flock(int(held2.Fd()), unix.LOCK_UN); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || len(r.c.Removed) != 3 {
				t.Errorf("Cleanup after the lock was let go = %+v, %v; want three paths removed", r.c, r.err)
			}
		})
	}
}

func TestNerdctlKeep(t *testing.T) {
	const sd = "/var/lib/nerdctl/1935db59/containers/default/" + ncID
	for _, tc := range []struct {
		name   string
		labels map[string]string
		reason string
	}{
		{"no labels", nil, ""},
		{"plain nerdctl container", map[string]string{"nerdctl/state-dir": sd, "nerdctl/name": "web"}, ""},
		{"restart running", map[string]string{"nerdctl/state-dir": sd,
			"containerd.io/restart.status": "running", "containerd.io/restart.policy": "always"}, NerdctlKeepRestartManaged},
		{"restart running, not nerdctl", map[string]string{"containerd.io/restart.status": "running"}, NerdctlKeepRestartManaged},
		{"restart policy without a status", map[string]string{"containerd.io/restart.policy": "unless-stopped"}, NerdctlKeepRestartManaged},
		{"restart stopped (nerdctl stop)", map[string]string{"nerdctl/state-dir": sd,
			"containerd.io/restart.status": "stopped", "containerd.io/restart.policy": "always"}, ""},
		{"shareable IPC", map[string]string{"nerdctl/state-dir": sd,
			"nerdctl/ipc": `{"mode":"shareable","hostShmPath":"` + sd + `/shm"}`}, NerdctlKeepShareableIPC},
		{"private IPC", map[string]string{"nerdctl/state-dir": sd, "nerdctl/ipc": `{"mode":"private"}`}, ""},
		{"IPC label that does not decode", map[string]string{"nerdctl/state-dir": sd, "nerdctl/ipc": `{`}, NerdctlKeepShareableIPC},
		{"shareable IPC label without a state dir", map[string]string{"nerdctl/ipc": `{"mode":"shareable"}`}, ""},
		{"image mounts", map[string]string{"nerdctl/state-dir": sd, "nerdctl/image-mount-snapshots": "x"}, NerdctlKeepImageMounts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, keep := NerdctlKeep(tc.labels)
			if reason != tc.reason || keep != (tc.reason != "") {
				t.Errorf("NerdctlKeep = %q, %v; want %q, %v", reason, keep, tc.reason, tc.reason != "")
			}
		})
	}
}
