package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultNerdctlDataRoot is nerdctl's default --data-root.
const DefaultNerdctlDataRoot = "/var/lib/nerdctl"

// Labels read here: nerdctl's own (nerdctl pkg/labels) and those of
// containerd's restart monitor, which nerdctl --restart uses.
const (
	nerdctlLabelStateDir      = "nerdctl/state-dir"
	nerdctlLabelName          = "nerdctl/name"
	nerdctlLabelNamespace     = "nerdctl/namespace"
	nerdctlLabelIPC           = "nerdctl/ipc"
	nerdctlLabelImageMounts   = "nerdctl/image-mount-snapshots"
	nerdctlLabelRestartStatus = "containerd.io/restart.status"
	nerdctlLabelRestartPolicy = "containerd.io/restart.policy"
)

// Reasons NerdctlKeep gives for keeping a container.
const (
	NerdctlKeepRestartManaged = "restart-managed"       // a restart policy wants it running
	NerdctlKeepShareableIPC   = "nerdctl-shareable-ipc" // a tmpfs is mounted in its state dir
	NerdctlKeepImageMounts    = "nerdctl-image-mounts"  // its image-mount views are GC roots
)

// nerdctlMaxDepth bounds a walk of a removed tree so that a hostile tree
// cannot exhaust file descriptors (nerdctl's are one level deep).
const nerdctlMaxDepth = 32

// nerdctlMaxLock bounds what is read of a name lock (nerdctl writes the id).
const nerdctlMaxLock = 4096

// ErrNerdctlLayout is wrapped by every error that refuses a container's
// nerdctl state because its labels or the files on disk do not fit
// nerdctl's layout. Such a refusal comes before anything is removed,
// unless the files changed while Cleanup was removing them.
var ErrNerdctlLayout = errors.New("does not fit nerdctl's layout")

// NerdctlKeep reports whether a container must not be deleted, and why,
// judged from its labels alone (no I/O): a restart policy wants it running
// (containerd.io/restart.status=running, or a restart.policy without a
// status, as the projection reads them: FIELD-2026 §2.4), for any
// container; or, for one made by nerdctl (it carries nerdctl/state-dir), it
// holds state that nerdctl rm frees and Nerdctl.Cleanup does not: a
// shareable IPC tmpfs mounted in its state dir (nerdctl/ipc mode
// shareable, or a label that does not decode) or image-mount views kept as
// GC roots (nerdctl/image-mount-snapshots). Deleting those would orphan
// that state, so they are left alone.
func NerdctlKeep(labels map[string]string) (reason string, keep bool) {
	if st, ok := labels[nerdctlLabelRestartStatus]; ok {
		if st == "running" {
			return NerdctlKeepRestartManaged, true
		}
	} else if _, ok := labels[nerdctlLabelRestartPolicy]; ok {
		return NerdctlKeepRestartManaged, true
	}
	if _, ok := labels[nerdctlLabelStateDir]; !ok {
		return "", false
	}
	if v := labels[nerdctlLabelIPC]; v != "" {
		var ipc struct {
			Mode string `json:"mode"`
		}
		if json.Unmarshal([]byte(v), &ipc) != nil || ipc.Mode == "shareable" {
			return NerdctlKeepShareableIPC, true
		}
	}
	if _, ok := labels[nerdctlLabelImageMounts]; ok {
		return NerdctlKeepImageMounts, true
	}
	return "", false
}

// Nerdctl removes, after a container made by nerdctl has been deleted
// through containerd, the state nerdctl keeps for it outside containerd,
// as `nerdctl rm` does (FIELD-2026 §5): its name lock
// <store>/names/<ns>/<name> when it holds the container's id, its hosts
// dir <store>/etchosts/<ns>/<id> and its state dir
// <store>/containers/<ns>/<id> (json logs, resolv.conf, ...). The store is
// read from the nerdctl/state-dir label and must be <DataRoot>/<8 hex>.
// Volumes are never touched. Every path is opened relative to the data
// root without following a symlink and removed with unlinkat; no removal
// crosses into another mount. Its methods are safe for concurrent use.
type Nerdctl struct {
	// DataRoot is nerdctl's --data-root, as nerdctl's labels name it and
	// as this process sees it (it may itself be a symlink); default
	// /var/lib/nerdctl.
	DataRoot string
}

// NerdctlCleaned is what Nerdctl.Cleanup removed, for the removal event.
type NerdctlCleaned struct {
	// Removed are the paths removed, in the order removed: the name lock,
	// the hosts dir, the state dir. A path already gone, or only partly
	// removed, is not listed.
	Removed []string `json:"removed,omitempty"`
	// Bytes are the bytes allocated to the files removed, those of a
	// partly removed tree included.
	Bytes int64 `json:"bytes,omitempty"`
	// NameHeldBy is the id the name lock held when it was not this
	// container's (the lock was kept), trimmed and cut to 256 bytes.
	NameHeldBy string `json:"nameHeldBy,omitempty"`
}

// nerdctlLayout is where a container's nerdctl state lies.
type nerdctlLayout struct {
	root      string // the cleaned data root
	store     string // the store's name in root: 8 hex digits
	ns, id    string
	name      string // "" when the container has no name label
	container string // ns/id, for messages
}

// path returns the path of elems in the store.
func (l nerdctlLayout) path(elems ...string) string {
	return filepath.Join(append([]string{l.root, l.store}, elems...)...)
}

// refuse returns an error wrapping ErrNerdctlLayout.
func (l nerdctlLayout) refuse(format string, a ...any) error {
	return fmt.Errorf("nerdctl state of %s: %s: %w", l.container, fmt.Sprintf(format, a...), ErrNerdctlLayout)
}

// Check reports, from the labels alone (no I/O), whether Cleanup would
// accept the container ns/id: nil for a container without
// nerdctl/state-dir or whose labels fit the layout, an error wrapping
// ErrNerdctlLayout naming why otherwise. Call it before the delete and keep
// a container it refuses: its state could not be cleaned after.
func (n Nerdctl) Check(ns, id string, labels map[string]string) error {
	_, _, err := n.layout(ns, id, labels)
	return err
}

// layout resolves the container's state from its labels. ok is false when
// it has no nerdctl/state-dir.
func (n Nerdctl) layout(ns, id string, labels map[string]string) (l nerdctlLayout, ok bool, err error) {
	sd, ok := labels[nerdctlLabelStateDir]
	if !ok {
		return nerdctlLayout{}, false, nil
	}
	l = nerdctlLayout{ns: ns, id: id, container: fmt.Sprintf("%q", ns+"/"+id)}
	root := n.DataRoot
	if root == "" {
		root = DefaultNerdctlDataRoot
	}
	if !filepath.IsAbs(root) {
		return l, true, l.refuse("data root %q is not absolute", root)
	}
	l.root = filepath.Clean(root)
	if !nerdctlElem(ns) || !nerdctlElem(id) {
		return l, true, l.refuse("namespace or id is not a single path element")
	}
	if v, ok := labels[nerdctlLabelNamespace]; ok && v != ns {
		return l, true, l.refuse("label %s is %q", nerdctlLabelNamespace, v)
	}
	if !filepath.IsAbs(sd) {
		return l, true, l.refuse("state dir %q is not absolute", sd)
	}
	for _, e := range strings.Split(sd, "/") {
		if e == ".." {
			return l, true, l.refuse("state dir %q has a .. element", sd)
		}
	}
	rel, err := filepath.Rel(l.root, filepath.Clean(sd))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return l, true, l.refuse("state dir %q is not under the data root %q", sd, l.root)
	}
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || parts[1] != "containers" {
		return l, true, l.refuse("state dir %q is not <data root>/<store>/containers/<namespace>/<id>", sd)
	}
	if !nerdctlHex8(parts[0]) {
		return l, true, l.refuse("state dir %q: store %q is not 8 hex digits", sd, parts[0])
	}
	if parts[2] != ns || parts[3] != id {
		return l, true, l.refuse("state dir %q is not that of this namespace and id", sd)
	}
	l.store = parts[0]
	l.name = labels[nerdctlLabelName]
	if l.name != "" && !nerdctlElem(l.name) {
		return l, true, l.refuse("name %q is not a single path element", l.name)
	}
	return l, true, nil
}

// Cleanup removes the nerdctl state of container ns/id, which containerd
// has deleted, and returns what it removed. A container without
// nerdctl/state-dir is not touched (zero NerdctlCleaned, nil). The name
// lock is released only when it holds id (compared as nerdctl's Release
// does, with surrounding space trimmed), under nerdctl's lock of its dir;
// the hosts dir is removed under nerdctl's lock of etchosts. Everything is
// checked before anything is removed: labels or files that do not fit the
// layout (a path outside <DataRoot>/<8 hex>, a symlink or a non-directory
// on the way, a symlink or special file as the name lock, a mount point
// in a removed tree) are refused with an error wrapping ErrNerdctlLayout
// and nothing is removed. A missing data root or store is an error; a
// missing lock, hosts dir or state dir is not, so a repeated Cleanup
// returns nil. Once removal has begun, each step is tried and their errors
// are joined; the result lists what was removed. ctx bounds the wait for
// nerdctl's locks.
func (n Nerdctl) Cleanup(ctx context.Context, ns, id string, labels map[string]string) (NerdctlCleaned, error) {
	l, ok, err := n.layout(ns, id, labels)
	if !ok || err != nil {
		return NerdctlCleaned{}, err
	}
	root, err := unix.Open(l.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return NerdctlCleaned{}, fmt.Errorf("nerdctl state of %s: open data root %q: %w", l.container, l.root, err)
	}
	defer unix.Close(root)
	store, err := l.openDirs(root, l.root, l.store)
	if err != nil {
		return NerdctlCleaned{}, err
	}
	if store < 0 {
		return NerdctlCleaned{}, fmt.Errorf("nerdctl state of %s: store %q does not exist", l.container, l.path())
	}
	defer unix.Close(store)

	// Open and check everything before removing anything.
	fds := make([]int, 0, 4)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	open := func(elems ...string) (int, error) {
		fd, err := l.openDirs(store, l.path(), elems...)
		if fd >= 0 {
			fds = append(fds, fd)
		}
		return fd, err
	}
	names, hostsTop, hosts, containers := -1, -1, -1, -1
	if l.name != "" {
		if names, err = open("names", ns); err != nil {
			return NerdctlCleaned{}, err
		}
	}
	if hostsTop, err = open("etchosts"); err != nil {
		return NerdctlCleaned{}, err
	}
	if hostsTop >= 0 {
		if hosts, err = l.openDirs(hostsTop, l.path("etchosts"), ns); err != nil {
			return NerdctlCleaned{}, err
		}
		if hosts >= 0 {
			fds = append(fds, hosts)
		}
	}
	if containers, err = open("containers", ns); err != nil {
		return NerdctlCleaned{}, err
	}
	if names >= 0 {
		if err := l.checkLock(names); err != nil {
			return NerdctlCleaned{}, err
		}
	}
	if hosts >= 0 {
		if _, err := l.tree(hosts, l.path("etchosts", ns, id), false, nil); err != nil {
			return NerdctlCleaned{}, err
		}
	}
	if containers >= 0 {
		if _, err := l.tree(containers, l.path("containers", ns, id), false, nil); err != nil {
			return NerdctlCleaned{}, err
		}
	}

	// Remove: the name lock, the hosts dir, the state dir.
	var c NerdctlCleaned
	var errs []error
	if names >= 0 {
		errs = append(errs, nerdctlLocked(ctx, names, l.path("names", ns), func() error {
			return l.releaseName(names, &c)
		}))
	}
	if hosts >= 0 {
		errs = append(errs, nerdctlLocked(ctx, hostsTop, l.path("etchosts"), func() error {
			p := l.path("etchosts", ns, id)
			found, err := l.tree(hosts, p, true, &c.Bytes)
			if found && err == nil {
				c.Removed = append(c.Removed, p)
			}
			return err
		}))
	}
	if containers >= 0 {
		p := l.path("containers", ns, id)
		found, err := l.tree(containers, p, true, &c.Bytes)
		if found && err == nil {
			c.Removed = append(c.Removed, p)
		}
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// openDirs opens elems one below the other from the directory open as
// dirfd, whose path is dir, following no symlink. It returns
// -1 and no error when one does not exist, and refuses a symlink or a
// non-directory.
func (l nerdctlLayout) openDirs(dirfd int, dir string, elems ...string) (int, error) {
	fd := dirfd
	for i, e := range elems {
		next, err := unix.Openat(fd, e, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			err = l.notDir(fd, e, filepath.Join(dir, filepath.Join(elems[:i+1]...)), err)
		}
		if fd != dirfd {
			unix.Close(fd)
		}
		if errors.Is(err, unix.ENOENT) {
			return -1, nil
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// notDir explains why opening name in dirfd as a directory failed: it is a
// symlink or another kind of file (a refusal), or err.
func (l nerdctlLayout) notDir(dirfd int, name, p string, err error) error {
	var st unix.Stat_t
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return l.refuse("%q is a symlink", p)
			}
			return l.refuse("%q is not a directory", p)
		}
	}
	return fmt.Errorf("nerdctl state of %s: open %q: %w", l.container, p, err)
}

// checkLock refuses a name lock that is not a regular file.
func (l nerdctlLayout) checkLock(names int) error {
	var st unix.Stat_t
	err := unix.Fstatat(names, l.name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	p := l.path("names", l.ns, l.name)
	if err != nil {
		return fmt.Errorf("nerdctl state of %s: stat %q: %w", l.container, p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return l.refuse("name lock %q is not a regular file", p)
	}
	return nil
}

// releaseName removes the name lock if it holds l.id, or records who holds
// it. The caller holds nerdctl's lock of names.
func (l nerdctlLayout) releaseName(names int, c *NerdctlCleaned) error {
	p := l.path("names", l.ns, l.name)
	fd, err := unix.Openat(names, l.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nerdctl state of %s: open %q: %w", l.container, p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("nerdctl state of %s: stat %q: %w", l.container, p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return l.refuse("name lock %q is not a regular file", p)
	}
	b := make([]byte, nerdctlMaxLock+1)
	k, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("nerdctl state of %s: read %q: %w", l.container, p, err)
	}
	if held := strings.TrimSpace(string(b[:k])); held != l.id {
		c.NameHeldBy = held[:min(len(held), 256)]
		return nil
	}
	if err := unix.Unlinkat(names, l.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nerdctl state of %s: unlink %q: %w", l.container, p, err)
	}
	c.Removed = append(c.Removed, p)
	c.Bytes += st.Blocks * 512
	return nil
}

// tree walks the tree l.id in the directory open as parent (its path is
// p), following no symlink and staying on parent's mount. It reports
// whether the tree existed. With remove it unlinks every entry bottom-up
// and adds the bytes of the files it removes to *bytes; otherwise it only
// checks: the tree must be a directory, and no entry in it a mount point.
func (l nerdctlLayout) tree(parent int, p string, remove bool, bytes *int64) (bool, error) {
	ref, err := nerdctlMountOf(parent)
	if err != nil {
		return false, fmt.Errorf("nerdctl state of %s: statx %q: %w", l.container, filepath.Dir(p), err)
	}
	var st unix.Stat_t
	err = unix.Fstatat(parent, l.id, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("nerdctl state of %s: stat %q: %w", l.container, p, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return true, l.refuse("%q is a symlink", p)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return true, l.refuse("%q is not a directory", p)
	}
	return true, l.walk(parent, l.id, p, ref, 0, remove, bytes)
}

// walk visits name in the directory open as parent; see tree.
func (l nerdctlLayout) walk(parent int, name, p string, ref nerdctlMount, depth int, remove bool, bytes *int64) error {
	stx, err := nerdctlStatx(parent, name, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nerdctl state of %s: statx %q: %w", l.container, p, err)
	}
	if ref.crosses(&stx) {
		return l.refuse("%q is a mount point", p)
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		if !remove {
			return nil
		}
		if err := unix.Unlinkat(parent, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("nerdctl state of %s: unlink %q: %w", l.container, p, err)
		}
		if bytes != nil {
			*bytes += int64(stx.Blocks) * 512
		}
		return nil
	}
	if depth >= nerdctlMaxDepth {
		return l.refuse("%q is deeper than %d levels", p, nerdctlMaxDepth)
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nerdctl state of %s: open %q: %w", l.container, p, err)
	}
	defer unix.Close(fd)
	// The name may have been swapped between statx and open: the directory
	// walked must be the one checked.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("nerdctl state of %s: stat %q: %w", l.container, p, err)
	}
	if st.Ino != stx.Ino || uint64(st.Dev) != unix.Mkdev(stx.Dev_major, stx.Dev_minor) {
		return l.refuse("%q changed during the walk", p)
	}
	children, err := nerdctlReadNames(fd, p)
	if err != nil {
		return fmt.Errorf("nerdctl state of %s: read %q: %w", l.container, p, err)
	}
	var errs []error
	for _, child := range children {
		err := l.walk(fd, child, filepath.Join(p, child), ref, depth+1, remove, bytes)
		if err != nil && !remove {
			return err
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil || !remove {
		return err
	}
	if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nerdctl state of %s: rmdir %q: %w", l.container, p, err)
	}
	return nil
}

// nerdctlReadNames lists the directory open as fd, leaving fd open.
func nerdctlReadNames(fd int, p string) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), p)
	defer f.Close()
	return f.Readdirnames(-1)
}

// nerdctlMount identifies the mount a walk must stay on.
type nerdctlMount struct {
	dev   uint64
	mntID uint64 // 0 when the kernel does not report it
}

func nerdctlStatx(dirfd int, name string, flags int) (unix.Statx_t, error) {
	var stx unix.Statx_t
	err := unix.Statx(dirfd, name, flags|unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BLOCKS|unix.STATX_MNT_ID, &stx)
	return stx, err
}

// nerdctlMountOf returns the mount of the directory open as fd.
func nerdctlMountOf(fd int) (nerdctlMount, error) {
	stx, err := nerdctlStatx(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return nerdctlMount{}, err
	}
	m := nerdctlMount{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor)}
	if stx.Mask&unix.STATX_MNT_ID != 0 {
		m.mntID = stx.Mnt_id
	}
	return m, nil
}

// crosses reports whether stx is a mount point or lies on another mount
// than m: the mount-root attribute, another mount id (a bind mount of the
// same filesystem) or another device.
func (m nerdctlMount) crosses(stx *unix.Statx_t) bool {
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return true
	}
	if m.mntID != 0 && stx.Mask&unix.STATX_MNT_ID != 0 && stx.Mnt_id != m.mntID {
		return true
	}
	return unix.Mkdev(stx.Dev_major, stx.Dev_minor) != m.dev
}

// nerdctlLockPoll is how often a held nerdctl lock is tried again.
const nerdctlLockPoll = 10 * time.Millisecond

// nerdctlLocked runs fn holding an exclusive flock of the directory open as
// dirfd, as nerdctl's lockutil.WithDirLock takes it, waiting for it until
// ctx is done.
func nerdctlLocked(ctx context.Context, dirfd int, p string, fn func() error) error {
	for {
		err := unix.Flock(dirfd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("lock %q: %w", p, err)
		}
		t := time.NewTimer(nerdctlLockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lock %q: %w", p, context.Cause(ctx))
		case <-t.C:
		}
	}
	defer unix.Flock(dirfd, unix.LOCK_UN)
	return fn()
}

// nerdctlElem reports whether s is one path element, neither . nor ..
func nerdctlElem(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// nerdctlHex8 reports whether s is 8 lower-case hex digits, as nerdctl
// names a store after its containerd address.
func nerdctlHex8(s string) bool {
	if len(s) != 8 {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}
