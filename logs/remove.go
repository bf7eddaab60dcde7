package logs

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// errMount is returned when a walk meets a mount point.
var errMount = errors.New("mount point")

// maxDepth bounds the walk of a pod dir (the kubelet's are two levels deep)
// so that a hostile tree cannot exhaust file descriptors.
const maxDepth = 32

// mountRef identifies the mount a walk must stay on: that of the configured
// directory.
type mountRef struct {
	dev   uint64
	mntID uint64 // 0 when the kernel does not report it
}

func statx(dirfd int, name string, flags int) (unix.Statx_t, error) {
	var stx unix.Statx_t
	err := unix.Statx(dirfd, name, flags|unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BLOCKS|unix.STATX_MNT_ID|unix.STATX_MTIME, &stx)
	return stx, err
}

// mountOf returns the mount of the directory open as fd.
func mountOf(fd int) (mountRef, error) {
	stx, err := statx(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return mountRef{}, err
	}
	ref := mountRef{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor)}
	if stx.Mask&unix.STATX_MNT_ID != 0 {
		ref.mntID = stx.Mnt_id
	}
	return ref, nil
}

// crosses reports whether stx is a mount point or lies on another mount
// than ref. Any one of three signals is enough: the mount-root attribute,
// another mount id (catches bind mounts of the same filesystem), another
// device.
func (ref mountRef) crosses(stx *unix.Statx_t) bool {
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return true
	}
	if ref.mntID != 0 && stx.Mask&unix.STATX_MNT_ID != 0 && stx.Mnt_id != ref.mntID {
		return true
	}
	return unix.Mkdev(stx.Dev_major, stx.Dev_minor) != ref.dev
}

// tally counts what a walk found or removed.
type tally struct {
	bytes   int64 // allocated bytes of non-directories, an estimate (hard links)
	entries int   // entries of every type, directories (the root included) too
	// changed is the newest mtime of the entries walked (the root
	// included), in nanoseconds since 1970.
	changed int64
}

// changedAt notes stx's mtime in t.
func (t *tally) changedAt(stx *unix.Statx_t) {
	if stx.Mask&unix.STATX_MTIME == 0 {
		return
	}
	if ns := stx.Mtime.Sec*int64(time.Second) + int64(stx.Mtime.Nsec); ns > t.changed {
		t.changed = ns
	}
}

// walk visits the tree at name in the directory open as parent without
// following any symlink and without crossing a mount point. With remove it
// unlinks every entry bottom-up (a symlink is unlinked as a link), the root
// last, goes on past an entry it cannot remove, and adds to *t what it
// removed; otherwise it only checks, adds to *t everything it would remove,
// and stops at the first mount point or error. An entry already gone is
// neither counted nor an error. path is for messages only.
func walk(parent int, name, path string, ref mountRef, depth int, remove bool, t *tally) error {
	stx, err := statx(parent, name, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("statx %s: %w", path, err)
	}
	if ref.crosses(&stx) {
		return fmt.Errorf("%s: %w", path, errMount)
	}
	t.changedAt(&stx)
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return count(t, int64(stx.Blocks)*512, unlink(parent, name, path, remove, 0))
	}
	if depth >= maxDepth {
		return fmt.Errorf("%s: deeper than %d levels", path, maxDepth)
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	// The name may have been swapped between statx and open: the directory
	// walked must be the one checked.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat %s: %w", path, err)
	}
	if st.Ino != stx.Ino || uint64(st.Dev) != unix.Mkdev(stx.Dev_major, stx.Dev_minor) {
		return fmt.Errorf("%s: changed during the walk", path)
	}
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var errs []error
	for _, child := range names {
		err := walk(fd, child, display(path, child), ref, depth+1, remove, t)
		if err != nil && !remove {
			return err
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return count(t, 0, unlink(parent, name, path, remove, unix.AT_REMOVEDIR))
}

// count adds an entry of bytes to t unless err says it was not removed
// (errGone: it was already gone, removed by someone else).
func count(t *tally, bytes int64, err error) error {
	if errors.Is(err, errGone) {
		return nil
	}
	if err == nil {
		t.bytes += bytes
		t.entries++
	}
	return err
}

// errGone says an entry to unlink was already gone.
var errGone = errors.New("already gone")

// unlink removes name of the directory open as dirfd when remove is set:
// errGone when it was already gone.
func unlink(dirfd int, name, path string, remove bool, flags int) error {
	if !remove {
		return nil
	}
	err := unix.Unlinkat(dirfd, name, flags)
	if errors.Is(err, unix.ENOENT) {
		return errGone
	}
	if err != nil {
		return fmt.Errorf("unlink %s: %w", path, err)
	}
	return nil
}

// errRecent is returned when a pod dir to remove changed too recently.
var errRecent = errors.New("changed within the grace")

// removePodDir removes the pod dir name of the directory open as root,
// recursively, after checking that nothing in it is a mount point and
// that nothing at or below it changed after quiet (wall clock; zero: not
// checked). With dryRun it only checks and returns what it would remove.
// Otherwise it returns what it removed: with an error, nothing when the
// check failed (nothing was touched), else what went before and after the
// entries it could not remove (a partial removal).
func removePodDir(root int, rootPath, name string, dryRun bool, quiet time.Time) (tally, error) {
	ref, err := mountOf(root)
	if err != nil {
		return tally{}, fmt.Errorf("statx %s: %w", rootPath, err)
	}
	path := display(rootPath, name)
	var found tally
	err = walk(root, name, path, ref, 0, false, &found)
	if err == nil && !quiet.IsZero() && found.changed > quiet.UnixNano() {
		err = fmt.Errorf("%s: %w: last at %s", path, errRecent, time.Unix(0, found.changed).UTC().Format(time.RFC3339Nano))
	}
	switch {
	case dryRun:
		return found, err
	case err != nil:
		return tally{}, err
	}
	var removed tally
	err = walk(root, name, path, ref, 0, true, &removed)
	return removed, err
}

// podDirChanged returns when anything at or below the pod dir name of the
// directory open as root last changed (the newest mtime), walking it as a
// removal's check does: errMount for a mount point met, an error for
// anything it could not read.
func podDirChanged(root int, rootPath, name string) (time.Time, error) {
	found, err := removePodDir(root, rootPath, name, true, time.Time{})
	if err != nil {
		return time.Time{}, err
	}
	if found.changed == 0 {
		return time.Time{}, fmt.Errorf("%s: no change time", display(rootPath, name))
	}
	return time.Unix(0, found.changed), nil
}

// removeLink unlinks the symlink name of the directory open as root and
// says whether it did. The caller has just re-checked that it is a
// dangling symlink; unlinkat never follows it. An entry already gone (its
// container's removal took it) is no error, and not removed.
func removeLink(root int, rootPath, name string, dryRun bool) (bool, error) {
	err := unlink(root, name, display(rootPath, name), !dryRun, 0)
	if errors.Is(err, errGone) {
		return false, nil
	}
	return err == nil, err
}
