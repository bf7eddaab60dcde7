package logs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/schema"
	"golang.org/x/sys/unix"
)

var (
	_ State            = (*fakeState)(nil)
	_ Publisher        = (*fakeBus)(nil)
	_ deletion.Journal = (*fakeBus)(nil)
	_ deleteLog        = (*deletion.Manager)(nil)
)

// fakeState is a hand-written projection.
type fakeState struct {
	mu         sync.Mutex
	synced     bool
	criRunning bool
	criAsked   int             // CRIContainersRunning calls
	containers map[string]bool // id -> running
	pods       map[string]fakePod
	logDirs    []string // SandboxLogDirs
	containerd string   // Containerd: the watched daemon's identity
}

type fakePod struct {
	alive     bool
	goneSince time.Time
}

func newFakeState() *fakeState {
	return &fakeState{synced: true, containers: map[string]bool{}, pods: map[string]fakePod{}, containerd: "containerd-1"}
}

func (s *fakeState) Containerd() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.containerd
}

func (s *fakeState) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

func (s *fakeState) CRIContainersRunning() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.criAsked++
	return s.criRunning
}

func (s *fakeState) ContainerState(id string) (running, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	running, known = s.containers[id]
	return running, known
}

func (s *fakeState) PodState(uid string) (alive bool, goneSince time.Time, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, known := s.pods[uid]
	return p.alive, p.goneSince, known
}

func (s *fakeState) SandboxLogDirs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.logDirs...)
}

// setLogDirs sets the log dirs of the sandboxes CRI has.
func (s *fakeState) setLogDirs(dirs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logDirs = dirs
}

func (s *fakeState) setContainer(id string, running bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.containers[id] = running
}

func (s *fakeState) setPod(uid string, p fakePod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[uid] = p
}

// wallAlong returns a wall clock that moves as now does: the real time
// when it is made, plus how far now has moved since. Files made before it
// is made have been quiet for at least as long as now has moved.
func wallAlong(now func() time.Time) func() time.Time {
	return wallFrom(time.Now(), now)
}

// wallFrom is wallAlong starting at the wall time start.
func wallFrom(start time.Time, now func() time.Time) func() time.Time {
	from := now()
	return func() time.Time { return start.Add(now().Sub(from)) }
}

// agedDir makes the directory dst with files (relative paths, content
// "log"), everything in it last modified ago before now: built beside it,
// backdated, and renamed into place, which keeps the mtimes.
func agedDir(t *testing.T, dst string, ago time.Duration, files ...string) {
	t.Helper()
	stage := filepath.Join(t.TempDir(), filepath.Base(dst))
	mkdirAll(t, stage)
	for _, f := range files {
		writeFile(t, filepath.Join(stage, f), "log\n")
	}
	backdate(t, ago, stage)
	if err := os.Rename(stage, dst); err != nil {
		t.Fatal(err)
	}
}

// fakeClock is stepped by tests; nothing sleeps.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// fakeBus is the journal of the delete transactions (a deletion.Journal
// in memory: a completed intent is published under its key, as the outbox
// stores it) and the Publisher of skips. log records "intend S",
// "complete S" and "abandon S" in order.
type fakeBus struct {
	mu      sync.Mutex
	seq     uint64
	pending map[uint64]deletion.Intent
	log     []string
	actions []schema.Action
}

func (b *fakeBus) Intend(ns string, a schema.Action, id *deletion.Identity) (deletion.Intent, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, err := json.Marshal(a.Data)
	if err != nil {
		return deletion.Intent{}, err
	}
	b.seq++
	in := deletion.Intent{Seq: b.seq, Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key, Data: d, Identity: id}
	if b.pending == nil {
		b.pending = map[uint64]deletion.Intent{}
	}
	b.pending[in.Seq] = in
	b.log = append(b.log, "intend "+a.Subject)
	return in, nil
}

func (b *fakeBus) Complete(in deletion.Intent, d any) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.pending[in.Seq]; !ok {
		return nil
	}
	delete(b.pending, in.Seq)
	b.log = append(b.log, "complete "+in.Subject)
	if d == nil {
		d = in.Data
	}
	b.actions = append(b.actions, schema.Action{Kind: in.Kind, Action: in.Action, Subject: in.Subject, Key: in.Key, Data: d})
	return nil
}

func (b *fakeBus) Abandon(in deletion.Intent) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.pending, in.Seq)
	b.log = append(b.log, "abandon "+in.Subject)
	return nil
}

func (b *fakeBus) Pending() ([]deletion.Intent, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []deletion.Intent
	for _, in := range b.pending {
		out = append(out, in)
	}
	return out, nil
}

func (b *fakeBus) Publish(a schema.Action) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.actions = append(b.actions, a)
	return nil
}

// all returns every action published, in order.
func (b *fakeBus) all() []schema.Action {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]schema.Action(nil), b.actions...)
}

// removals returns the data of the log.removed actions, in order.
func (b *fakeBus) removals() []Removal {
	var out []Removal
	for _, a := range b.all() {
		if a.Kind == schema.KindLog && a.Action == schema.ActionRemoved {
			out = append(out, a.Data.(Removal))
		}
	}
	return out
}

func (b *fakeBus) journal() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.log...)
}

// lstatChecker is the node's Gone check for logs, an lstat of the path;
// err, when set, is what the node says instead.
type lstatChecker struct{ err error }

func (c lstatChecker) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	if c.err != nil {
		return false, c.err
	}
	_, err := os.Lstat(in.Subject)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	return false, err
}

// newDeletes returns delete transactions journaled in a new fakeBus and
// settled by c.
func newDeletes(t testing.TB, c deletion.Checker) (*deletion.Manager, *fakeBus) {
	t.Helper()
	b := &fakeBus{}
	m, err := deletion.New(deletion.Deps{Journal: b, Checker: c}, deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return m, b
}

// snapshot describes every entry under root without following symlinks:
// type and mode, link target, sha256 of file contents. It reads through
// mount points, so mounted content is covered too.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " -> " + target
		case info.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " " + hex.EncodeToString(sum[:])
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

// without returns snap minus the given entries and everything under them.
func without(snap map[string]string, gone ...string) map[string]string {
	out := map[string]string{}
next:
	for k, v := range snap {
		for _, g := range gone {
			if k == g || strings.HasPrefix(k, g+"/") {
				continue next
			}
		}
		out[k] = v
	}
	return out
}

func diffSnap(want, got map[string]string) string {
	var b strings.Builder
	for k, v := range want {
		if g, ok := got[k]; !ok {
			fmt.Fprintf(&b, "missing %q (%s)\n", k, v)
		} else if g != v {
			fmt.Fprintf(&b, "changed %q: %s -> %s\n", k, v, g)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "unexpected %q (%s)\n", k, v)
		}
	}
	return b.String()
}

// canMount reports whether mount tests can run: as root they do; otherwise
// they are skipped, except under CI=true where that is a failure.
func canMount(t *testing.T) bool {
	t.Helper()
	if os.Geteuid() == 0 {
		return true
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("mount tests need root and CI=true forbids skipping them: run `make test` as root")
	}
	t.Log("not root: skipping the bind-mount parts (run `make test` as root)")
	return false
}

// bindMount bind-mounts src on dst and unmounts it at cleanup.
func bindMount(t *testing.T, src, dst string) {
	t.Helper()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("mount --bind %s %s: %v", src, dst, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			t.Errorf("umount %s: %v", dst, err)
		}
	})
}

func mkdirAll(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	mkdirAll(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// cid returns a 64-hex container id that starts with prefix (hex digits).
func cid(prefix string) string {
	return prefix + strings.Repeat("0", 64-len(prefix))
}
