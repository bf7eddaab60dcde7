package natsbus

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openOutboxOrMoveAside opens the outbox at path like openOutbox; when the
// file is there but is not a usable bbolt file (garbage, a torn or foreign
// file, pages that make bbolt fail or panic), it renames it to
// path.corrupt-<UTC time>, keeping it for a post-mortem, and starts an empty
// outbox. A crash loop on a corrupt outbox would stop GC on the node for
// good; moving it aside loses only the events that waited in it. It returns
// where the file went and why ("" and nil when the file was fine). Errors of
// the file system (permissions, a read-only or full disk) and a lock held by
// another process are returned as they are: moving the file would not fix them.
func openOutboxOrMoveAside(path string, lim limits, now time.Time) (ob *outbox, movedTo string, why, err error) {
	ob, err = openOutboxRecovering(path, lim)
	if err == nil || !corruptOutbox(err) {
		return ob, "", nil, err
	}
	movedTo = path + ".corrupt-" + now.UTC().Format("20060102T150405.000000000Z")
	if rerr := os.Rename(path, movedTo); rerr != nil {
		return nil, "", nil, fmt.Errorf("%w; moving it aside failed: %v", err, rerr)
	}
	ob, nerr := openOutbox(path, lim)
	if nerr != nil {
		return nil, movedTo, err, nerr
	}
	return ob, movedTo, err, nil
}

// openOutboxRecovering is openOutbox with bbolt's panics on corrupt pages
// turned into errors.
func openOutboxRecovering(path string, lim limits) (ob *outbox, err error) {
	defer func() {
		if r := recover(); r != nil {
			ob, err = nil, errCorruptFile{fmt.Errorf("natsbus: open outbox %s: corrupt file: %v", path, r)}
		}
	}()
	if fi, serr := os.Stat(path); serr == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		// bbolt reads the meta pages at open: a file it cannot parse fails here.
		ob, err = openOutbox(path, lim)
		if err != nil && !errors.Is(err, bolt.ErrTimeout) && !isFSError(err) {
			return nil, errCorruptFile{err}
		}
		return ob, err
	}
	return openOutbox(path, lim)
}

// errCorruptFile marks an outbox file bbolt cannot use.
type errCorruptFile struct{ err error }

func (e errCorruptFile) Error() string { return e.err.Error() }
func (e errCorruptFile) Unwrap() error { return e.err }

func corruptOutbox(err error) bool {
	var c errCorruptFile
	return errors.As(err, &c)
}

// isFSError reports an error of the file system rather than of the file's content.
func isFSError(err error) bool {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se)
}
