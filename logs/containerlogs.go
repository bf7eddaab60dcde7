package logs

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/schema"
	"golang.org/x/sys/unix"
)

// ContainerLogs removes, with a CRI container the agent removes, what the
// kubelet's own removal removes with it (removeContainerLog in the
// kubelet's kuberuntime_container.go): the attempt's log file
// <pod-log-dir>/<namespace>_<name>_<uid>/<container>/<attempt>.log, found
// by the path CRI gives for it, every file beside it whose name starts
// with that file's (its rotated files, <attempt>.log.<timestamp> and
// .gz: the kubelet globs "<log path>*"), and the legacy link
// <log-dir>/<pod>_<namespace>_<container>-<id>.log when it points at that
// log file (the kubelet removes it by name, which, cut to 255 bytes, may
// be another attempt's). Unlike the kubelet it
// removes files only in the pod's own dir under PodLogDir, relative to an
// open directory (openat, unlinkat), never following a link and never
// crossing a mount point, and never a directory. Its methods are safe for
// concurrent use.
type ContainerLogs struct {
	cfg Config
}

var _ interface {
	FindContainerLogs(gc.ContainerLogRef) (gc.ContainerLogs, error)
	RemoveContainerLogs(gc.ContainerLogRef) (gc.ContainerLogs, []gc.LogRemoval, error)
} = (*ContainerLogs)(nil)

// NewContainerLogs returns a ContainerLogs for the directories of cfg,
// which must pass Validate.
func NewContainerLogs(cfg Config) (*ContainerLogs, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &ContainerLogs{cfg: cfg}, nil
}

// FindContainerLogs lists what RemoveContainerLogs would remove now.
func (l *ContainerLogs) FindContainerLogs(ref gc.ContainerLogRef) (gc.ContainerLogs, error) {
	out, _, err := l.walk(ref, false)
	return out, err
}

// RemoveContainerLogs removes the container's legacy link, then its log
// files. It returns what it removed, as a whole and path by path (each
// with its kind, its configured directory, its name relative to it and
// its bytes: what a log.removed event says of it), and an error when
// something that is the container's could not go (the caller keeps the
// container, as the kubelet does, for a retry): what went before that is
// returned all the same. A file already gone is no error; files it must
// not touch (outside the pod's dir, behind a link or a mount point)
// stay, with the reason in Kept.
func (l *ContainerLogs) RemoveContainerLogs(ref gc.ContainerLogRef) (gc.ContainerLogs, []gc.LogRemoval, error) {
	return l.walk(ref, true)
}

// walk goes through the legacy link first, then the files: removed in
// the kubelet's order (files, then link), the link would dangle for a
// moment, and the log cleaner, which reacts within milliseconds, would
// remove and report it a second time.
func (l *ContainerLogs) walk(ref gc.ContainerLogRef, remove bool) (gc.ContainerLogs, []gc.LogRemoval, error) {
	out := gc.ContainerLogs{Path: ref.LogPath}
	var paths []gc.LogRemoval
	if err := l.link(ref, remove, &out, &paths); err != nil {
		return out, paths, err
	}
	dir, base, why := l.logDir(ref)
	if why != "" {
		out.Kept = why
		return out, paths, nil
	}
	err := l.files(dir, base, remove, &out, &paths)
	return out, paths, err
}

// logDir maps CRI's log path to the agent's view and checks that it lies
// in the pod's own dir: dir is its directory relative to PodLogDir, base
// its name; why says why not.
func (l *ContainerLogs) logDir(ref gc.ContainerLogRef) (dir []string, base, why string) {
	switch {
	case ref.LogPath == "":
		return nil, "", "no log path in CRI's status"
	case !filepath.IsAbs(ref.LogPath):
		return nil, "", "log path not absolute"
	}
	path, ok := l.cfg.TargetInView(ref.LogPath)
	if !ok {
		return nil, "", "log path outside the pod log dir"
	}
	parts := strings.Split(strings.TrimPrefix(path, l.cfg.PodLogDir+"/"), "/")
	if len(parts) < 2 || len(parts) > maxDepth {
		return nil, "", "log path not in a pod's dir"
	}
	if uid, ok := PodUID(parts[0]); !ok || ref.PodUID == "" || uid != ref.PodUID {
		return nil, "", "log path not in the pod's own dir"
	}
	return parts[:len(parts)-1], parts[len(parts)-1], ""
}

// files finds (and with remove, removes) the log files: the entries of
// dir (under PodLogDir) named base or starting with it that are not
// directories.
func (l *ContainerLogs) files(dir []string, base string, remove bool, out *gc.ContainerLogs, paths *[]gc.LogRemoval) error {
	root, err := openRoot(l.cfg.PodLogDir)
	if err != nil || root < 0 {
		return err // missing: nothing to remove
	}
	defer unix.Close(root)
	ref, err := mountOf(root)
	if err != nil {
		return fmt.Errorf("statx %s: %w", l.cfg.PodLogDir, err)
	}
	fd, path := root, l.cfg.PodLogDir
	for _, name := range dir {
		next, kept, err := descend(fd, name, display(path, name), ref)
		if fd != root {
			unix.Close(fd)
		}
		if err != nil || next < 0 {
			out.Kept = kept
			return err
		}
		fd, path = next, display(path, name)
	}
	defer unix.Close(fd)
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, base) {
			continue
		}
		stx, err := statx(fd, name, 0)
		switch {
		case errors.Is(err, unix.ENOENT):
			continue
		case err != nil:
			return fmt.Errorf("statx %s: %w", display(path, name), err)
		case stx.Mode&unix.S_IFMT == unix.S_IFDIR:
			continue // never a directory
		case ref.crosses(&stx):
			out.Kept = display(path, name) + " is a mount point"
			continue
		}
		if err := unlink(fd, name, display(path, name), remove, 0); errors.Is(err, errGone) {
			continue
		} else if err != nil {
			return err
		}
		bytes := int64(stx.Blocks) * 512
		out.Files = append(out.Files, display(path, name))
		out.Bytes += bytes
		*paths = append(*paths, gc.LogRemoval{Kind: schema.LogKindFile, Dir: l.cfg.PodLogDir,
			Name: strings.Join(append(slices.Clone(dir), name), "/"), Bytes: bytes, Entries: 1})
	}
	return nil
}

// descend opens the directory name of parent, on the mount ref, without
// following a link: next is -1 when it is missing (nothing below to
// remove) or when it may not be entered (kept says why).
func descend(parent int, name, path string, ref mountRef) (next int, kept string, err error) {
	stx, err := statx(parent, name, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return -1, "", nil
	case err != nil:
		return -1, "", fmt.Errorf("statx %s: %w", path, err)
	case stx.Mode&unix.S_IFMT != unix.S_IFDIR:
		return -1, path + " is not a directory", nil
	case ref.crosses(&stx):
		return -1, path + " is a mount point", nil
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return -1, "", nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return -1, path + " is not a directory", nil
	case err != nil:
		return -1, "", fmt.Errorf("open %s: %w", path, err)
	}
	// The name may have been swapped between statx and open.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != stx.Ino || uint64(st.Dev) != unix.Mkdev(stx.Dev_major, stx.Dev_minor) {
		unix.Close(fd)
		return -1, path + " changed while opened", nil
	}
	return fd, "", nil
}

// link finds (and with remove, removes) the legacy link of the container
// in LogDir: only a symlink that points at the container's log (CRI's
// path for it), unlinked as a link.
func (l *ContainerLogs) link(ref gc.ContainerLogRef, remove bool, out *gc.ContainerLogs, paths *[]gc.LogRemoval) error {
	name, ok := legacyLinkName(ref)
	if !ok {
		return nil
	}
	root, err := openRoot(l.cfg.LogDir)
	if err != nil || root < 0 {
		return err
	}
	defer unix.Close(root)
	var st unix.Stat_t
	err = unix.Fstatat(root, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("lstat %s: %w", display(l.cfg.LogDir, name), err)
	case st.Mode&unix.S_IFMT != unix.S_IFLNK:
		return nil // not the kubelet's link
	}
	// The name is cut to 255 bytes, inside the id when the pod, namespace
	// and container names are long: then each attempt's link has the same
	// name, and only the one that points at this attempt's log is its.
	target, err := readlinkat(root, name)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("readlink %s: %w", display(l.cfg.LogDir, name), err)
	case ref.LogPath == "" || filepath.Clean(target) != filepath.Clean(ref.LogPath):
		return nil // another attempt's link (or nothing to tell by): it stays
	}
	if err := unlink(root, name, display(l.cfg.LogDir, name), remove, 0); errors.Is(err, errGone) {
		return nil
	} else if err != nil {
		return err
	}
	out.Link = display(l.cfg.LogDir, name)
	*paths = append(*paths, gc.LogRemoval{Kind: KindSymlink, Dir: l.cfg.LogDir, Name: name, Entries: 1})
	return nil
}

// legacyLinkName is the kubelet's legacy link name of the container
// (legacyLogSymlink): <pod>_<namespace>_<container>-<id>.log, cut to the
// 255 bytes a name may have. ok is false when a part is missing or holds
// a '/'.
func legacyLinkName(ref gc.ContainerLogRef) (string, bool) {
	for _, p := range []string{ref.PodName, ref.PodNamespace, ref.ContainerName, ref.ID} {
		if p == "" || strings.ContainsAny(p, "/\x00") {
			return "", false
		}
	}
	name := ref.PodName + "_" + ref.PodNamespace + "_" + ref.ContainerName + "-" + ref.ID
	if len(name) > maxNameLen-len(".log") {
		name = name[:maxNameLen-len(".log")]
	}
	return name + ".log", true
}
