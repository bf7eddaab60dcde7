package logs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/gc"
	"golang.org/x/sys/unix"
)

// PodDirsFile is the name of the file, in the agent's state dir, that
// holds what it saw of the pod log dir.
const PodDirsFile = "poddirs.json"

// PodDirsStaleAfter is how long after its last full read the pod log dir
// counts as stale: the Cleaner reads it on every change and at least every
// FloorSweep, so a read this old says its reads fail or stopped.
const PodDirsStaleAfter = 3 * FloorSweep

// podDirsMemory is how long a pod dir that went is remembered: long after
// the kubelet and the agent removed what the pod left.
const podDirsMemory = 24 * time.Hour

// PodDirs is what the agent has seen of the pod log dir: the kubelet's
// sign that a pod is deleted is that its dir (<namespace>_<name>_<uid>),
// which the kubelet makes before the pod's sandbox and removes only once
// the pod is deleted, goes away. Absence alone is no sign: a dir that is
// not the kubelet's (an empty one a hostPath made, a mount point not
// mounted, another podLogsDir) holds no pod, and would make every stopped
// pod look deleted. So a pod's dir counts as gone only when the agent saw
// it, in this very directory (the same device and inode), and a later
// full read of that directory no longer holds it.
//
// What it saw is kept in a file in the state dir, so a restart keeps the
// evidence; a dir seen before the restart and missing after counts as
// gone from the first read after the restart. A lost or unreadable file,
// or a pod log dir that is now another directory, is no evidence at all:
// nothing counts as gone until a dir is seen again and goes. Methods are
// safe for concurrent use.
type PodDirs struct {
	mu   sync.Mutex
	file string // "": not persisted
	doc  podDirsDoc
	// read is the state of the pod log dir as an input.
	read gc.Input
	// lastRead is when the last full read succeeded (zero: none yet).
	lastRead time.Time
	dirty    bool
	// changed is told (without blocking) when a dir went: a pod may now
	// count as deleted.
	changed chan struct{}
}

// podDirsDoc is the file's content.
type podDirsDoc struct {
	// Root identifies the directory the dirs were seen in.
	Root DirID `json:"root"`
	// Dirs are the pod dirs seen, by name.
	Dirs map[string]*podDir `json:"dirs"`
	// Evidence is the strongest that Root was shown to be the kubelet's
	// and the watched containerd's (Cleaner.evidence); nil: none yet.
	Evidence *Evidence `json:"evidence,omitempty"`
}

// DirID identifies a directory: its device and inode, and its birth time
// where the filesystem keeps one (ext4, xfs, btrfs, tmpfs): a directory
// removed and made again (rm -rf and mkdir; a tmpfs mounted again at
// boot) often gets the same device and inode, never the same birth.
type DirID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
	// Born is the birth time in nanoseconds since 1970; 0 where the
	// filesystem keeps none.
	Born int64 `json:"born,omitempty"`
}

func (d DirID) String() string {
	if d.Born == 0 {
		return fmt.Sprintf("%d:%d", d.Dev, d.Ino)
	}
	return fmt.Sprintf("%d:%d born %s", d.Dev, d.Ino, time.Unix(0, d.Born).UTC().Format(time.RFC3339Nano))
}

// podDir is one pod dir seen.
type podDir struct {
	SeenAt time.Time `json:"seenAt"`          // first seen (in this root)
	GoneAt time.Time `json:"goneAt,omitzero"` // first full read without it; zero while there
}

// NewPodDirs returns an empty PodDirs that keeps what it sees in file
// ("" : nowhere).
func NewPodDirs(file string) *PodDirs {
	return &PodDirs{file: file, doc: podDirsDoc{Dirs: map[string]*podDir{}}, changed: make(chan struct{}, 1),
		read: gc.Input{Cause: "not read yet"}}
}

// LoadPodDirs returns the PodDirs kept in file. A missing file is a first
// start; an unreadable one is reported in err, and the PodDirs returned
// (empty) is usable: fail closed, no dir counts as seen.
func LoadPodDirs(file string) (*PodDirs, error) {
	d := NewPodDirs(file)
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("pod log dirs seen: %w", err)
	}
	var doc podDirsDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return d, fmt.Errorf("pod log dirs seen: %s: %w", file, err)
	}
	for name, pd := range doc.Dirs {
		if pd == nil || pd.SeenAt.IsZero() || strings.ContainsRune(name, '/') {
			delete(doc.Dirs, name)
		}
	}
	if doc.Dirs == nil {
		doc.Dirs = map[string]*podDir{}
	}
	d.doc = doc
	return d, nil
}

// Clone returns a copy that is not persisted (for plans).
func (d *PodDirs) Clone() *PodDirs {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := NewPodDirs("")
	c.doc.Root, c.read, c.lastRead = d.doc.Root, d.read, d.lastRead
	if d.doc.Evidence != nil {
		ev := *d.doc.Evidence
		c.doc.Evidence = &ev
	}
	for name, pd := range d.doc.Dirs {
		cp := *pd
		c.doc.Dirs[name] = &cp
	}
	return c
}

// evidence is what was shown of the current root for the containerd
// named containerd (zero: nothing); other is what was shown for another
// one (or by a version that did not say for which, or while none was
// known), which says nothing of this one's pods.
func (d *PodDirs) evidence(containerd string) (ev Evidence, other *Evidence) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch saved := d.doc.Evidence; {
	case saved == nil:
		return Evidence{}, nil
	case saved.Containerd == "" || saved.Containerd != containerd:
		cp := *saved
		return Evidence{}, &cp
	default:
		return *saved, nil
	}
}

// verify records that ev (verified) was shown at now of the current root
// for the containerd named containerd, unless as much was shown before
// for it, and returns what is recorded: a directory once shown to hold
// that containerd's pods stays so (until the pod log dir is another
// directory, observe starts afresh, or another containerd shows
// something), and Since is when it was first shown.
func (d *PodDirs) verify(ev Evidence, containerd string, now time.Time) Evidence {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.doc.Evidence; old != nil && old.Containerd == containerd && (old.By == ev.By || old.Watched()) {
		return *old
	}
	ev.Since, ev.Containerd = now, containerd
	d.doc.Evidence, d.dirty = &ev, true
	return ev
}

// Changed signals (coalesced) that a pod dir went.
func (d *PodDirs) Changed() <-chan struct{} { return d.changed }

// observe records a full read, at now, of the pod log dir identified as
// root: dirs are the names of its entries that are directories, unsure
// those whose type could not be read (neither seen nor gone). A root
// other than the one the dirs were seen in starts afresh: what was seen
// elsewhere says nothing of this one.
func (d *PodDirs) observe(root DirID, dirs, unsure []string, now time.Time) (restarted bool, was DirID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	was = d.doc.Root
	if root != d.doc.Root {
		restarted = len(d.doc.Dirs) > 0
		d.doc = podDirsDoc{Root: root, Dirs: map[string]*podDir{}}
		d.dirty = true
	}
	present := make(map[string]bool, len(dirs)+len(unsure))
	for _, name := range dirs {
		present[name] = true
		pd := d.doc.Dirs[name]
		switch {
		case pd == nil:
			d.doc.Dirs[name] = &podDir{SeenAt: now}
			d.dirty = true
		case !pd.GoneAt.IsZero():
			pd.GoneAt = time.Time{} // back
			d.dirty = true
		}
	}
	for _, name := range unsure {
		present[name] = true
	}
	went := false
	for name, pd := range d.doc.Dirs {
		switch {
		case present[name]:
		case pd.GoneAt.IsZero():
			pd.GoneAt, d.dirty, went = now, true, true
		case now.Sub(pd.GoneAt) > podDirsMemory:
			delete(d.doc.Dirs, name)
			d.dirty = true
		}
	}
	d.read, d.lastRead = gc.KnownInput(now), now
	if went {
		select {
		case d.changed <- struct{}{}:
		default:
		}
	}
	return restarted, was
}

// Read reads the pod log dir at path once, at now, as a Cleaner's pass
// does (for a plan without a running agent; a Cleaner feeds its own).
func (d *PodDirs) Read(path string, now time.Time) {
	fd, err := openRoot(path)
	switch {
	case err != nil:
		d.failed(err.Error(), now)
		return
	case fd < 0:
		d.failed("missing", now)
		return
	}
	defer unix.Close(fd)
	id, err := dirID(fd)
	if err != nil {
		d.failed(err.Error(), now)
		return
	}
	es, unsure, read, err := scanDir(Config{PodLogDir: path}, fd, path, KindPodDir)
	if !read {
		d.failed(err.Error(), now)
		return
	}
	d.observe(id, podDirNames(es), unsure, now)
}

// podDirNames are the names of the entries that are directories.
func podDirNames(es []Entry) []string {
	var names []string
	for _, e := range es {
		if e.Type == fs.ModeDir {
			names = append(names, e.Name)
		}
	}
	return names
}

// went records that the pod dir name, seen in the current root, went at
// now by the agent's own hand (the Cleaner removed it): as good as a read
// without it.
func (d *PodDirs) went(name string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd := d.doc.Dirs[name]; pd != nil && pd.GoneAt.IsZero() {
		pd.GoneAt, d.dirty = now, true
	}
}

// failed records a read of the pod log dir that failed at now (missing
// included): what was seen stays, but the input is stale (or still
// unknown).
func (d *PodDirs) failed(cause string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	state := gc.InputUnknown
	if !d.lastRead.IsZero() {
		state = gc.InputStale
	}
	d.read = gc.Input{State: state, Since: now, Cause: cause}
	if state == gc.InputStale {
		d.read.Since = d.lastRead
	}
}

// Input is the state of the pod log dir as an input at now: known while
// its last full read succeeded within PodDirsStaleAfter, stale after (or
// when the last read failed), unknown before the first.
func (d *PodDirs) Input(now time.Time) gc.Input {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.read
	if in.State == gc.InputKnown && now.Sub(d.lastRead) > PodDirsStaleAfter {
		in = gc.Input{State: gc.InputStale, Since: d.lastRead, Cause: "not read for " + now.Sub(d.lastRead).Round(time.Second).String()}
	}
	return in
}

// Gone reports whether the log dir of the pod (uid, namespace, name) was
// seen and then went, and since when: false while it is there, and for a
// dir never seen (not yet, or before a lost state or another root).
func (d *PodDirs) Gone(uid, namespace, name string) (since time.Time, gone bool) {
	if uid == "" || namespace == "" || name == "" {
		return time.Time{}, false
	}
	return d.dirGone(namespace + "_" + name + "_" + uid)
}

// dirGone is Gone by the dir's name.
func (d *PodDirs) dirGone(name string) (since time.Time, gone bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	pd := d.doc.Dirs[name]
	if pd == nil || pd.GoneAt.IsZero() {
		return time.Time{}, false
	}
	return pd.GoneAt, true
}

// Seen returns the names of the dirs seen and there, and of those gone
// (for tests and status).
func (d *PodDirs) Seen() (there, gone []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(d.doc.Dirs)) {
		if d.doc.Dirs[name].GoneAt.IsZero() {
			there = append(there, name)
		} else {
			gone = append(gone, name)
		}
	}
	return there, gone
}

// Save writes what changed since the last Save to the file, atomically
// (synced before and after the rename). Losing it is safe: a dir not
// known as seen is no sign, and a gone time not saved is taken again,
// later.
func (d *PodDirs) Save() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.file == "" || !d.dirty {
		return nil
	}
	b, err := json.Marshal(d.doc)
	if err != nil {
		return err
	}
	if err := writeFileSynced(d.file, b); err != nil {
		return fmt.Errorf("save pod log dirs seen: %w", err)
	}
	d.dirty = false
	return nil
}

// writeFileSynced replaces path with b: written to a temporary file,
// synced, renamed over path, and the directory synced.
func writeFileSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync()
		_ = dir.Close()
	}
	return nil
}

// dirID identifies the directory open as fd.
func dirID(fd int) (DirID, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_BTIME, &stx); err != nil {
		return DirID{}, err
	}
	id := DirID{Dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), Ino: stx.Ino}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.Born = time.Unix(stx.Btime.Sec, int64(stx.Btime.Nsec)).UnixNano()
	}
	return id, nil
}

// dirsRead gives dirs a full read of the pod log dir (identified as id);
// with save (a Cleaner's pass, not a plan), what an operator must hear is
// logged once. The pass saves dirs after it (saveDirs).
func (c *Cleaner) dirsRead(dirs *PodDirs, id DirID, es []Entry, unsure []string, now time.Time, save bool) {
	restarted, was := dirs.observe(id, podDirNames(es), unsure, now)
	if !save {
		return
	}
	if restarted {
		c.log.Warn().Str("path", c.cfg.PodLogDir).Str("dir_id", id.String()).Str("was_dir_id", was.String()).
			Msg("the pod log dir is another directory than the one its pod dirs were seen in: no pod counts as deleted until its dir is seen here and goes")
	}
	if c.dirsSaid != "" {
		c.dirsSaid = ""
		c.log.Info().Str("path", c.cfg.PodLogDir).Msg("pod log dir read again")
	}
}

// saveDirs saves what dirs holds, logging a failure once. The caller
// holds c.mu.
func (c *Cleaner) saveDirs(dirs *PodDirs) {
	if err := dirs.Save(); err != nil {
		c.metrics.error("state")
		if !c.saveSaid {
			c.saveSaid = true
			c.log.Warn().Err(err).Msg("pod dirs seen not saved: after a restart, pods deleted meanwhile are not told")
		}
	} else {
		c.saveSaid = false
	}
}

// dirsFailed records a failed read of the pod log dir, logged once per
// cause.
func (c *Cleaner) dirsFailed(dirs *PodDirs, cause string, now time.Time, save bool) {
	dirs.failed(cause, now)
	if save && c.dirsSaid != cause {
		c.dirsSaid = cause
		c.log.Warn().Str("path", c.cfg.PodLogDir).Str("cause", cause).
			Msg("pod log dir not read: no pod counts as deleted by it, and no log link as dangling, until it is")
	}
}
