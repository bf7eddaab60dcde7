package kubeletconfig

import (
	"os"
	"syscall"
)

// File follows a kubelet config file across rewrites: editors, kubeadm and
// configuration management write a new file and rename it over the old
// one (a new inode), others write in place. Poll notices both with one
// stat, so it is cheap to call every few seconds; the file is read only
// when it changed. Not safe for concurrent use.
type File struct {
	// Path is the file, as --kubelet-config names it (a symlink is
	// followed: swapping its target is a change too).
	Path string

	seen   stamp
	polled bool
}

// stamp tells one version of a file from another: another inode (a
// rename over it), or the same one written since (size, mtime, ctime; a
// write in place of the same size within the filesystem's timestamp
// granularity, a few milliseconds, is not told apart).
type stamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
	// errno is why the file could not be stat-ed (ENOENT: absent).
	errno syscall.Errno
}

func stampOf(path string) (stamp, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		errno, _ := err.(syscall.Errno)
		return stamp{errno: errno}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return stamp{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, nil
}

// Poll stats the file. When it is not the file the last Poll saw (renamed
// over, written since, gone or back), it reads it again: changed is true
// and s is what the file now says, or err says why there is nothing
// (fs.ErrNotExist when it is absent, else a read or decoding error, as
// Read's). The first Poll always reads. An absent or unreadable file is
// reported once, not at every Poll.
func (f *File) Poll() (s *Settings, changed bool, err error) {
	now, err := stampOf(f.Path)
	if f.polled && now == f.seen {
		return nil, false, nil
	}
	f.polled, f.seen = true, now
	if err != nil {
		return nil, true, err
	}
	s, err = Read(f.Path)
	return s, true, err
}
