package logs

import (
	"errors"
	"fmt"

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
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BLOCKS|unix.STATX_MNT_ID, &stx)
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

// walk visits the tree at name in the directory open as parent without
// following any symlink and without crossing a mount point, and adds the
// allocated bytes of its non-directories to *freed. With remove it unlinks
// every entry bottom-up (a symlink is unlinked as a link), the root last;
// otherwise it only checks, and stops at the first mount point. An entry
// already gone counts as removed. path is for messages only.
func walk(parent int, name, path string, ref mountRef, depth int, remove bool, freed *int64) error {
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
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		*freed += int64(stx.Blocks) * 512
		return unlink(parent, name, path, remove, 0)
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
		err := walk(fd, child, display(path, child), ref, depth+1, remove, freed)
		if err != nil && !remove {
			return err
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return unlink(parent, name, path, remove, unix.AT_REMOVEDIR)
}

func unlink(dirfd int, name, path string, remove bool, flags int) error {
	if !remove {
		return nil
	}
	if err := unix.Unlinkat(dirfd, name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlink %s: %w", path, err)
	}
	return nil
}

// removePodDir removes the pod dir name of the directory open as root,
// recursively, after checking that nothing in it is a mount point. With
// dryRun it only checks. It returns the bytes the tree held.
func removePodDir(root int, rootPath, name string, dryRun bool) (freed int64, err error) {
	ref, err := mountOf(root)
	if err != nil {
		return 0, fmt.Errorf("statx %s: %w", rootPath, err)
	}
	path := display(rootPath, name)
	if err := walk(root, name, path, ref, 0, false, &freed); err != nil || dryRun {
		return freed, err
	}
	var ignored int64
	return freed, walk(root, name, path, ref, 0, true, &ignored)
}

// removeLink unlinks the symlink name of the directory open as root. The
// caller has just re-checked that it is a dangling symlink; unlinkat never
// follows it.
func removeLink(root int, rootPath, name string, dryRun bool) error {
	return unlink(root, name, display(rootPath, name), !dryRun, 0)
}
