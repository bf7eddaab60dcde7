package projection

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Reset says that the state file could not be read and was moved aside: the
// projection starts empty and is rebuilt from containerd, so what only the
// file knew (first seen, last used, exit times of reaped tasks) is lost.
type Reset struct {
	Path    string    // the state file
	MovedTo string    // where the unreadable file now is; kept for inspection
	Err     error     // why it could not be read
	At      time.Time // when it was moved
}

// errUnreadable marks a state file that exists but cannot be read as a
// store: moving it aside is the only way to start.
type errUnreadable struct{ err error }

func (e errUnreadable) Error() string { return e.err.Error() }
func (e errUnreadable) Unwrap() error { return e.err }

// OpenStoreOrReset opens the store at path like OpenStore and checks that
// everything Load and later writes need can be read. When the file is
// unreadable (not a bbolt file, truncated, checksum errors, pages that make
// bbolt panic, a snapshot that does not decode) it renames it to
// path.corrupt-<UTC time> and opens a new, empty store; the Reset says so.
// Errors that say nothing about the file's content (another process holds
// it, permissions, a full disk) are returned as they are: the file is kept
// where it is.
func OpenStoreOrReset(path string, now time.Time) (*Store, *Reset, error) {
	st, err := openChecked(path)
	if err == nil {
		return st, nil, nil
	}
	var bad errUnreadable
	if !errors.As(err, &bad) {
		return nil, nil, err
	}
	r := &Reset{Path: path, Err: bad.err, At: now.UTC(),
		MovedTo: path + ".corrupt-" + now.UTC().Format("20060102T150405.000000000Z")}
	if err := os.Rename(path, r.MovedTo); err != nil {
		return nil, nil, fmt.Errorf("move unreadable state %s aside (%v): %w", path, bad.err, err)
	}
	st, err = OpenStore(path)
	if err != nil {
		return nil, nil, err
	}
	return st, r, nil
}

// openChecked reads all of an existing file once, read-only, so that a
// damaged file is moved aside exactly as it was found, then opens it for
// writing. bbolt trusts its file: a damaged page can make it panic or,
// through its memory map, fault; both become errUnreadable here, in the
// caller's goroutine, so that a damaged file is moved aside instead of
// crash-looping the agent.
func openChecked(path string) (st *Store, err error) {
	var ro *Store
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if ro != nil {
				_ = ro.Close() // unmaps and unlocks; the file is moved next
			}
			st, err = nil, errUnreadable{fmt.Errorf("reading state panicked: %v", r)}
		}
	}()
	fi, err := os.Stat(path)
	if err == nil && fi.Mode().IsRegular() {
		if fi.Size() == 0 {
			// bbolt would quietly start over in an empty file; a file the
			// agent wrote is never empty, so history was lost: say so.
			return nil, errUnreadable{errors.New("state file is empty")}
		}
		ro, err = OpenStoreReadOnly(path)
		if err != nil {
			if isCorruptOpen(err) {
				return nil, errUnreadable{err}
			}
			return nil, err
		}
		err = ro.check()
		loaded := ro.loaded
		_ = ro.Close()
		ro = nil
		if err != nil {
			return nil, errUnreadable{err}
		}
		// The check decoded every projection: the agent's first Load of
		// each takes it from there instead of decoding the file again.
		if st, err = OpenStore(path); err == nil {
			st.loaded = loaded
		}
		return st, err
	}
	return OpenStore(path)
}

// isCorruptOpen tells a file bbolt cannot use from a failure to get at it.
func isCorruptOpen(err error) bool {
	for _, e := range []error{berrors.ErrInvalid, berrors.ErrChecksum, berrors.ErrVersionMismatch, berrors.ErrInvalidMapping} {
		if errors.Is(err, e) {
			return true
		}
	}
	return strings.Contains(err.Error(), "file size too small")
}

// check reads every page reachable from the root (every key of every
// bucket), checks that the file holds all the pages its meta page claims,
// and decodes the snapshot as Load will. Journal entries that do not decode
// are not a reason to reset: Load skips them and the reconcile repairs.
func (st *Store) check() error {
	err := st.db.View(func(tx *bolt.Tx) error {
		fi, err := os.Stat(st.db.Path())
		if err != nil {
			return err
		}
		if fi.Size() < tx.Size() {
			return fmt.Errorf("state file is %d bytes, its meta page says %d: truncated", fi.Size(), tx.Size())
		}
		// Every byte of every key and value is read: a length that points
		// past the map faults here, under SetPanicOnFault, instead of in
		// the first write that copies it (fatal, FuzzOpenStore found it).
		var sum uint32
		err = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				sum = crc32.Update(crc32.Update(sum, crc32.IEEETable, k), crc32.IEEETable, v)
				return nil
			})
		})
		_ = sum
		return err
	})
	if err != nil {
		return err
	}
	loaded, err := st.LoadSpaces()
	st.loaded = &loaded
	return err
}

// LoadSpaces loads the projection of every namespace the file holds.
func (st *Store) LoadSpaces() (map[string]LoadResult, error) {
	names, err := st.Spaces()
	if err != nil {
		return nil, err
	}
	out := make(map[string]LoadResult, len(names))
	for _, ns := range names {
		res, err := st.Space(ns).Load()
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		out[ns] = res
	}
	return out, nil
}

// ReadStore loads the store at path read-only, for tools beside a stopped
// agent: a damaged file is an error, never a panic. It fails when the
// agent holds the file.
func ReadStore(path string) (res map[string]LoadResult, err error) {
	var ro *Store
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if ro != nil {
				_ = ro.Close()
			}
			res, err = nil, fmt.Errorf("state %s unreadable: %v", path, r)
		}
	}()
	if ro, err = OpenStoreReadOnly(path); err != nil {
		return nil, err
	}
	defer func() {
		if ro != nil {
			_ = ro.Close()
		}
	}()
	if err := ro.check(); err != nil {
		return nil, fmt.Errorf("state %s unreadable: %w", path, err)
	}
	return ro.LoadSpaces()
}
