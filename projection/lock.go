package projection

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// LockedError is the error of opening a state file another process holds
// (bbolt's flock timed out): it names the state dir and, when
// /proc/locks tells, the holder's pid.
type LockedError struct {
	Path string
	Pid  int // 0: unknown (the holder is in another pid namespace, or no /proc)
}

func (e *LockedError) Error() string {
	if e.Pid > 0 {
		return fmt.Sprintf("state dir %s is locked by another gcagent (pid %d)", filepath.Dir(e.Path), e.Pid)
	}
	return fmt.Sprintf("state dir %s is locked by another gcagent (pid unknown: not visible in /proc/locks)", filepath.Dir(e.Path))
}

// Unwrap is bbolt's timeout.
func (e *LockedError) Unwrap() error { return berrors.ErrTimeout }

// locked returns a *LockedError when err is bbolt's timeout waiting for
// the lock of path, else nil.
func locked(path string, err error) error {
	if !errors.Is(err, berrors.ErrTimeout) {
		return nil
	}
	return &LockedError{Path: path, Pid: lockHolder(path, "/proc/locks")}
}

// lockHolder returns the pid holding a lock on path as the locks file
// (/proc/locks) lists it, or 0.
func lockHolder(path, locksFile string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	f, err := os.Open(locksFile)
	if err != nil {
		return 0
	}
	defer f.Close()
	return holderIn(f, unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino, os.Getpid())
}

// holderIn reads lines of /proc/locks ("1: FLOCK  ADVISORY  WRITE 1234
// 08:01:5678 0 EOF", device numbers in hex) and returns the pid of a
// granted lock on the inode, other than self; waiters ("1: -> FLOCK ...")
// are not holders.
func holderIn(r io.Reader, major, minor uint32, ino uint64, self int) int {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] == "->" {
			continue
		}
		dev := strings.Split(f[5], ":")
		if len(dev) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(dev[0], 16, 32)
		mnr, err2 := strconv.ParseUint(dev[1], 16, 32)
		in, err3 := strconv.ParseUint(dev[2], 10, 64)
		pid, err4 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		if uint32(maj) == major && uint32(mnr) == minor && in == ino && pid > 0 && pid != self {
			return pid
		}
	}
	return 0
}
