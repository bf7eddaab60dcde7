package logs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openRoot opens a configured directory. The configured path itself may go
// through symlinks (it is configuration); nothing below it is followed.
// A missing directory is not an error: fd is -1.
func openRoot(path string) (fd int, err error) {
	fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return fd, nil
}

// readNames lists the entry names of an open directory as raw bytes, "." and
// ".." excluded. The fd must not have been read before.
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return names, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// fileType maps st_mode to the type bits of fs.FileMode.
func fileType(mode uint32) fs.FileMode {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return 0
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	}
	return fs.ModeIrregular
}

// scanEntry looks at one entry of root without following it, and for a
// *.log symlink of LogDir also reads its target and stats it where the
// agent sees it (cfg.TargetInView). gone is true when the entry does not
// exist (any more).
func scanEntry(cfg Config, root int, kind Kind, name string) (e Entry, gone bool, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(root, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return Entry{}, true, nil
	}
	if err != nil {
		return Entry{}, false, err
	}
	e = Entry{Kind: kind, Name: name, Type: fileType(st.Mode)}
	if kind == KindSymlink && e.Type == fs.ModeSymlink && strings.HasSuffix(name, ".log") {
		e.Changed = mtime(&st) // when the link was made: a symlink's own times change with nothing else
		statTarget(cfg, root, &e)
	}
	return e, false, nil
}

// statTarget reads the target of the symlink e.Name of root, says whether
// it lies in the pod log dir the agent sees (and in which pod dir), and
// sets e.TargetErr to the error of stat there (nil: it exists). Following is a read: it tells
// dangling from not. No automount. A target mapped from the host's pod log
// dir is stat'ed both where it maps to and through the link: ENOENT only
// when neither finds it. For a target that is not found it also says
// whether the directory meant to hold it exists, and which pod dir it is
// in: a file missing from a directory that is there is gone; one whose
// directory is missing may be in a pod log dir the agent does not see.
func statTarget(cfg Config, root int, e *Entry) {
	var st unix.Stat_t
	through := func() error { return unix.Fstatat(root, e.Name, &st, unix.AT_NO_AUTOMOUNT) }
	target, rerr := readlinkat(root, e.Name)
	if rerr != nil {
		// Unreadable: no path to judge; the stat through the link still
		// tells whether it exists.
		e.TargetErr = through()
		return
	}
	e.Target = target
	path, inView := cfg.TargetInView(target)
	e.TargetInView = inView
	if !inView || path == filepath.Join(cfg.LogDir, target) || path == filepath.Clean(target) {
		e.TargetErr = through() // the kernel resolves it to path (or it is not in view)
	} else {
		e.TargetErr = unix.Fstatat(unix.AT_FDCWD, path, &st, unix.AT_NO_AUTOMOUNT)
		if errors.Is(e.TargetErr, unix.ENOENT) && through() == nil {
			e.TargetErr = nil
		}
	}
	if !inView {
		return
	}
	rel := strings.TrimPrefix(path, cfg.PodLogDir+"/")
	e.TargetPodDir, _, _ = strings.Cut(rel, "/")
	if !errors.Is(e.TargetErr, unix.ENOENT) {
		return
	}
	var dir unix.Stat_t
	err := unix.Fstatat(unix.AT_FDCWD, filepath.Dir(path), &dir, unix.AT_NO_AUTOMOUNT)
	e.TargetDirExists = err == nil && dir.Mode&unix.S_IFMT == unix.S_IFDIR && filepath.Dir(path) != cfg.PodLogDir
}

// readlinkat reads the target of the symlink name of the directory open as
// dirfd. It starts small (a kubelet's target is about 150 bytes; a pass
// reads every link) and grows up to PATH_MAX.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > unix.PathMax {
			return "", unix.ENAMETOOLONG
		}
	}
}

// scanDir scans every entry of root. Per-entry errors are collected and the
// scan goes on; unsure are the names whose entry could not be looked at.
// An error reading the directory itself returns no entries and read false.
// path is for messages only.
func scanDir(cfg Config, root int, path string, kind Kind) (entries []Entry, unsure []string, read bool, err error) {
	names, err := readNames(root)
	if err != nil {
		return nil, nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	entries = make([]Entry, 0, len(names))
	var errs []error
	for _, name := range names {
		e, gone, err := scanEntry(cfg, root, kind, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("lstat %s: %w", display(path, name), err))
			unsure = append(unsure, name)
			continue
		}
		if !gone {
			entries = append(entries, e)
		}
	}
	return entries, unsure, true, errors.Join(errs...)
}

// mountedNames returns the names of the entries of the directory open as
// root that are, or contain, a mount point according to
// /proc/self/mountinfo. The walk before a removal checks again with statx;
// this makes the plan say why.
func mountedNames(root int) (map[string]bool, error) {
	dir, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(root))
	if err != nil {
		return nil, fmt.Errorf("resolve pod log dir: %w", err)
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(data, dir), nil
}

// parseMountinfo returns the first path component below dir of every mount
// point under dir.
func parseMountinfo(data []byte, dir string) map[string]bool {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeOctal(fields[4])
		if rest, ok := strings.CutPrefix(mp, prefix); ok && rest != "" {
			name, _, _ := strings.Cut(rest, "/")
			names[name] = true
		}
	}
	return names
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline and
// backslash in mountinfo paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// display renders dir/name for logs and errors, quoting names that are not
// valid UTF-8 or hold control characters so that every byte stays visible.
func display(dir, name string) string {
	q := strconv.Quote(name)
	if q[1:len(q)-1] != name {
		name = q
	}
	return dir + "/" + name
}
