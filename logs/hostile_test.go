package logs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// hostile is a tree built to trip a careless cleaner.
type hostile struct {
	base, logDir, podDir, outside string
	state                         *fakeState
	clock                         *fakeClock
	mounted                       bool
	// wall0 is the wall time at t0: every entry was last changed then,
	// but the pod dirs of pods gone at least 10s before t0, an hour
	// before.
	wall0 time.Time
}

// wall is the wall clock of h's clock.
func (h *hostile) wall() func() time.Time { return wallFrom(h.wall0, h.clock.Now) }

const (
	uidLive    = "11111111-1111-1111-1111-111111111111"
	uidMounted = "22222222-2222-2222-2222-222222222222"
	uidOrphan  = "33333333-3333-3333-3333-333333333333"
	uidYoung   = "44444444-4444-4444-4444-444444444444"
	uidWeird   = "55555555-5555-5555-5555-555555555555"
	uidSym     = "66666666-6666-6666-6666-666666666666"
	uidNever   = "77777777-7777-7777-7777-777777777777"
	uidWhole   = "88888888-8888-8888-8888-888888888888"
)

var (
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	idExited    = cid("e01")
	idUnknown   = cid("f02")
	idRunning   = cid("a03")
	idTargetOK  = cid("e04")
	idOutside   = cid("e05")
	idLoopA     = cid("e06")
	idLoopB     = cid("e07")
	idRegular   = cid("e08")
	idWeird     = cid("e09")
	idDir       = cid("e0a")
	idToOutside = cid("e0b")

	// Names, relative to base.
	linkExited    = "containers/web_default_app-" + idExited + ".log"
	linkUnknown   = "containers/web_default_app-" + idUnknown + ".log"
	linkRunning   = "containers/web_default_app-" + idRunning + ".log"
	linkTargetOK  = "containers/live_default_app-" + idTargetOK + ".log"
	linkOutside   = "containers/evil_default_app-" + idOutside + ".log"
	linkLoopA     = "containers/loop_default_a-" + idLoopA + ".log"
	linkLoopB     = "containers/loop_default_b-" + idLoopB + ".log"
	fileRegular   = "containers/plain_default_app-" + idRegular + ".log"
	linkWeird     = "containers/sp ace pod\xff\xfe_n s_app-" + idWeird + ".log"
	dirDotLog     = "containers/dir_default_app-" + idDir + ".log"
	linkNotLog    = "containers/notalog-" + idExited
	linkShortID   = "containers/short_default_app-abc.log"
	linkToMissing = "containers/gone_default_app-" + idToOutside + ".log"

	podLive     = "pods/default_live_" + uidLive
	podMounted  = "pods/default_mounted_" + uidMounted
	podOrphan   = "pods/default_orphan_" + uidOrphan
	podYoung    = "pods/default_young_" + uidYoung
	podWeird    = "pods/ns wi th space_p\xff\xfeod_" + uidWeird
	podSymlink  = "pods/default_symlinked_" + uidSym
	podNever    = "pods/default_never_" + uidNever
	podWhole    = "pods/default_whole_" + uidWhole
	podLostF    = "pods/lost+found"
	podFile     = "pods/default_file_" + uidOrphan + "x"
	podBadUID   = "pods/default_x_abc\xff"
	podDotLinks = "pods/default_orphan_" + uidOrphan + "/app/outside-link"
)

func newHostile(t *testing.T) *hostile {
	h := &hostile{base: t.TempDir(), outside: t.TempDir(), state: newFakeState(), clock: &fakeClock{t: t0}}
	h.logDir, h.podDir = filepath.Join(h.base, "containers"), filepath.Join(h.base, "pods")
	p := func(rel string) string { return filepath.Join(h.base, rel) }

	// Outside: files and a directory that links point at.
	writeFile(t, filepath.Join(h.outside, "secret.txt"), "do not touch\n")
	writeFile(t, filepath.Join(h.outside, "dir", "precious.log"), "precious\n")
	writeFile(t, filepath.Join(h.outside, "mountsrc", "data.txt"), "mounted content\n")
	writeFile(t, filepath.Join(h.outside, "mountsrc2", "data.txt"), "whole mounted\n")

	mkdirAll(t, h.logDir)
	mkdirAll(t, h.podDir)

	// Pod dirs.
	writeFile(t, p(podLive+"/app/0.log"), "live log\n")
	writeFile(t, p(podMounted+"/app/0.log"), "mounted pod log\n")
	writeFile(t, p(podOrphan+"/app/0.log"), "orphan log\n")
	writeFile(t, p(podOrphan+"/app/1.log.20260301-120000.gz"), "rotated\n")
	writeFile(t, p(podOrphan+"/app/deep/er/x.log"), "deep\n")
	symlink(t, filepath.Join(h.outside, "secret.txt"), p(podDotLinks))
	symlink(t, filepath.Join(h.outside, "dir"), p(podOrphan+"/app/outside-dir-link"))
	symlink(t, "../../..", p(podOrphan+"/app/up-link"))
	writeFile(t, p(podYoung+"/app/0.log"), "young log\n")
	writeFile(t, p(podWeird+"/app/0.log"), "weird log\n")
	symlink(t, filepath.Join(h.outside, "dir"), p(podSymlink))
	writeFile(t, p(podNever+"/app/0.log"), "never known\n")
	writeFile(t, p(podWhole+"/app/0.log"), "covered by a mount\n")
	mkdirAll(t, p(podLostF))
	writeFile(t, p(podFile), "a file, not a dir\n")
	writeFile(t, p(podBadUID+"/app/0.log"), "bad uid\n")

	// Links.
	symlink(t, p(podOrphan+"/app/missing.log"), p(linkExited))
	symlink(t, p(podLive+"/app/9.log"), p(linkUnknown)) // gone from a dir that is there
	symlink(t, p("pods/rotating/app/0.log"), p(linkRunning))
	symlink(t, p(podLive+"/app/0.log"), p(linkTargetOK))
	symlink(t, filepath.Join(h.outside, "secret.txt"), p(linkOutside))
	symlink(t, filepath.Base(linkLoopB), p(linkLoopA))
	symlink(t, filepath.Base(linkLoopA), p(linkLoopB))
	writeFile(t, p(fileRegular), "regular file\n")
	symlink(t, p(podLive+"/app/8.log"), p(linkWeird))
	mkdirAll(t, p(dirDotLog))
	symlink(t, p("pods/nowhere/0.log"), p(linkNotLog))
	symlink(t, p("pods/nowhere/0.log"), p(linkShortID))
	symlink(t, filepath.Join(h.outside, "missing.txt"), p(linkToMissing))

	h.wall0 = time.Now()
	stamp(t, h.wall0, h.base)
	for _, old := range []string{podMounted, podOrphan, podYoung, podWeird, podWhole} {
		stamp(t, h.wall0.Add(-time.Hour), p(old))
	}

	if canMount(t) {
		h.mounted = true
		bindMount(t, filepath.Join(h.outside, "mountsrc"), p(podMounted+"/app")) // under the pod dir
		bindMount(t, filepath.Join(h.outside, "mountsrc2"), p(podWhole))         // the pod dir itself
	}

	for _, id := range []string{idExited, idTargetOK, idOutside, idLoopA, idLoopB, idRegular, idWeird, idDir, idToOutside} {
		h.state.setContainer(id, false)
	}
	h.state.setContainer(idRunning, true)
	h.state.setPod(uidLive, fakePod{alive: true})
	gone := fakePod{goneSince: t0.Add(-time.Hour)}
	for _, uid := range []string{uidMounted, uidOrphan, uidWeird, uidSym, uidWhole} {
		h.state.setPod(uid, gone)
	}
	h.state.setPod(uidYoung, fakePod{goneSince: t0.Add(-10 * time.Second)})
	return h
}

// unmounted lists the pod dirs that would have had a mount: without root
// they are plain orphans and go in the first pass.
func (h *hostile) unmounted() []string {
	if h.mounted {
		return nil
	}
	return []string{podMounted, podWhole}
}

func (h *hostile) config() Config {
	return Config{LogDir: h.logDir, PodLogDir: h.podDir, PodLogGrace: time.Minute}
}

func TestHostileTree(t *testing.T) {
	h := newHostile(t)
	deletes, bus := newDeletes(t, lstatChecker{})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	c, err := New(Deps{State: h.state, Deletes: deletes, Publisher: bus}, Options{Config: h.config(), Metrics: m, Clock: clock.System(h.clock.Now), Wall: h.wall(), Log: zerolog.New(&logBuf)})
	if err != nil {
		t.Fatal(err)
	}
	base0, outside0 := snapshot(t, h.base), snapshot(t, h.outside)
	check := func(step string, removed ...string) {
		t.Helper()
		if d := diffSnap(without(base0, removed...), snapshot(t, h.base)); d != "" {
			t.Errorf("%s: tree:\n%s", step, d)
		}
		if d := diffSnap(outside0, snapshot(t, h.outside)); d != "" {
			t.Errorf("%s: outside tree changed:\n%s", step, d)
		}
	}
	// linkToMissing dangles, its container exited, but its target lies
	// outside the pod log dir: unverifiable, kept.
	removedFirst := append([]string{linkExited, linkWeird, podOrphan, podWeird}, h.unmounted()...)

	// Not synced: nothing at all.
	h.state.mu.Lock()
	h.state.synced = false
	h.state.mu.Unlock()
	if _, err := c.Clean(context.Background()); err != nil {
		t.Fatalf("unsynced pass: %v", err)
	}
	check("unsynced")
	h.state.mu.Lock()
	h.state.synced = true
	h.state.mu.Unlock()

	// Pass 1 at t0.
	plan, err := c.Clean(context.Background())
	if err != nil {
		t.Fatalf("pass 1: %v", err)
	}
	check("pass 1", removedFirst...)
	if want := t0.Add(50 * time.Second); !plan.Next.Equal(want) {
		t.Errorf("Next = %v, want %v (young pod's deadline)", plan.Next, want)
	}
	reasons := map[string]Reason{}
	for _, d := range plan.Decisions {
		reasons[string(d.Kind)+":"+d.Name] = d.Reason
	}
	for name, want := range map[string]Reason{
		"symlink:" + filepath.Base(linkRunning):   ReasonContainerRunning,
		"symlink:" + filepath.Base(linkTargetOK):  ReasonTargetExists,
		"symlink:" + filepath.Base(linkOutside):   ReasonTargetExists,
		"symlink:" + filepath.Base(linkLoopA):     ReasonTargetError,
		"symlink:" + filepath.Base(fileRegular):   ReasonNotSymlink,
		"symlink:" + filepath.Base(dirDotLog):     ReasonNotSymlink,
		"symlink:" + filepath.Base(linkNotLog):    ReasonNotLog,
		"symlink:" + filepath.Base(linkShortID):   ReasonBadName,
		"symlink:" + filepath.Base(linkUnknown):   ReasonGrace,
		"symlink:" + filepath.Base(linkExited):    ReasonContainerExited,
		"symlink:" + filepath.Base(linkToMissing): ReasonTargetUnverifiable,
		"poddir:" + filepath.Base(podLive):        ReasonPodAlive,
		"poddir:" + filepath.Base(podSymlink):     ReasonNotDirectory,
		"poddir:" + filepath.Base(podFile):        ReasonNotDirectory,
		"poddir:" + filepath.Base(podLostF):       ReasonBadName,
		"poddir:" + filepath.Base(podBadUID):      ReasonBadName,
		"poddir:" + filepath.Base(podYoung):       ReasonGrace,
		"poddir:" + filepath.Base(podNever):       ReasonGrace,
		"poddir:" + filepath.Base(podOrphan):      ReasonPodGone,
	} {
		if got := reasons[name]; got != want {
			t.Errorf("%q: reason %q, want %q", name, got, want)
		}
	}
	if h.mounted {
		for _, name := range []string{podMounted, podWhole} {
			if got := reasons["poddir:"+filepath.Base(name)]; got != ReasonMountPoint {
				t.Errorf("%q: reason %q, want %q", name, got, ReasonMountPoint)
			}
		}
	}

	// Just before the young pod's deadline nothing more goes.
	h.clock.Set(t0.Add(50*time.Second - time.Nanosecond))
	if _, err := c.Clean(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("before deadline", removedFirst...)

	// At the deadline the young pod dir goes.
	h.clock.Set(t0.Add(50 * time.Second))
	plan, err = c.Clean(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	removedSecond := append(removedFirst, podYoung)
	check("young deadline", removedSecond...)
	if want := t0.Add(time.Minute); !plan.Next.Equal(want) {
		t.Errorf("Next = %v, want %v (first-seen grace)", plan.Next, want)
	}

	// At first seen + grace the unknown container's link and the never-known
	// pod dir go.
	h.clock.Set(t0.Add(time.Minute))
	plan, err = c.Clean(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	removedAll := append(removedSecond, linkUnknown, podNever)
	check("first-seen deadline", removedAll...)
	if !plan.Next.IsZero() {
		t.Errorf("Next = %v, want none", plan.Next)
	}

	// Events, metrics and logs: once per removal.
	pubs := bus.removals()
	if len(pubs) != len(removedAll) || len(bus.all()) != len(pubs) {
		t.Errorf("published %d removals, want %d: %+v", len(pubs), len(removedAll), pubs)
	}
	for _, r := range pubs {
		if r.Kind == KindPodDir && r.Bytes <= 0 {
			t.Errorf("removal %+v: want bytes > 0", r)
		}
		if r.Kind == KindPodDir && r.UID == "" || r.Kind == KindSymlink && r.Container == "" {
			t.Errorf("removal %+v: missing uid/container", r)
		}
		if r.Partial || r.Error != "" || r.Namespace != "k8s.io" || r.Entries < 1 {
			t.Errorf("removal %+v: want complete, of namespace k8s.io, with its entries", r)
		}
	}
	if got, want := testutil.ToFloat64(m.removed.WithLabelValues("poddir", "pod-gone")), 3+len(h.unmounted()); got != float64(want) {
		t.Errorf("removed{poddir,pod-gone} = %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(m.removed.WithLabelValues("symlink", "container-exited")); got != 2 {
		t.Errorf("removed{symlink,container-exited} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.unverifiable); got != 1 {
		t.Errorf("links unverifiable = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.skipped.WithLabelValues("symlink", "target-exists")); got != 2 {
		t.Errorf("skipped{symlink,target-exists} = %v, want 2", got)
	}
	var removedLines int
	for line := range strings.SplitSeq(strings.TrimSpace(logBuf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["component"] != "logs" {
			t.Errorf("log line without component=logs: %s", line)
		}
		if rec["message"] == "removed" {
			removedLines++
			if rec["path"] == nil || rec["reason"] == nil || rec["uid"] == nil && rec["container"] == nil {
				t.Errorf("removal log line lacks path/reason/uid|container: %s", line)
			}
		}
	}
	if removedLines != len(removedAll) {
		t.Errorf("%d removal log lines, want %d:\n%s", removedLines, len(removedAll), logBuf.String())
	}
	if !strings.Contains(logBuf.String(), `p\\xff\\xfeod`) {
		t.Errorf("the non-UTF-8 pod dir name is not logged byte-exactly (quoted):\n%s", logBuf.String())
	}

	// The mounted content is untouched, and readable through the mount.
	if h.mounted {
		data, err := os.ReadFile(filepath.Join(h.base, podMounted, "app", "data.txt"))
		if err != nil || string(data) != "mounted content\n" {
			t.Errorf("mounted content: %q, %v", data, err)
		}
	}
}

// TestDryRunDeletesNothing runs the hostile tree in dry-run mode: nothing
// changes, and each would-be removal is published exactly once.
func TestDryRunDeletesNothing(t *testing.T) {
	h := newHostile(t)
	cfg := h.config()
	cfg.DryRun = true
	deletes, bus := newDeletes(t, lstatChecker{})
	c, err := New(Deps{State: h.state, Deletes: deletes, Publisher: bus}, Options{Config: cfg, Clock: clock.System(h.clock.Now), Wall: h.wall()})
	if err != nil {
		t.Fatal(err)
	}
	base0, outside0 := snapshot(t, h.base), snapshot(t, h.outside)
	for _, at := range []time.Duration{0, 0, time.Hour} {
		h.clock.Set(t0.Add(at))
		plan, err := c.Clean(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !plan.DryRun {
			t.Error("plan.DryRun = false")
		}
	}
	if d := diffSnap(base0, snapshot(t, h.base)); d != "" {
		t.Errorf("dry run changed the tree:\n%s", d)
	}
	if d := diffSnap(outside0, snapshot(t, h.outside)); d != "" {
		t.Errorf("dry run changed the outside tree:\n%s", d)
	}
	if got, want := len(bus.all()), 7+len(h.unmounted()); got != want {
		t.Errorf("published %d dry-run skips, want %d: %+v", got, want, bus.all())
	}
	if j := bus.journal(); len(j) != 0 {
		t.Errorf("a dry run recorded delete intents: %v", j)
	}
	// Finding 8: a dry run publishes log.skipped with reason dry-run, never
	// log.removed.
	for _, a := range bus.all() {
		s, ok := a.Data.(skip)
		if a.Kind != "log" || a.Action != "skipped" || !ok || s.SkipReason != "dry-run" || !s.DryRun ||
			a.Subject != filepath.Join(s.Dir, s.Name) || !strings.HasSuffix(a.Key, "#dry-run") {
			t.Errorf("dry run published %s.%s %q key %q data %+v, want log.skipped of the path, reason dry-run", a.Kind, a.Action, a.Subject, a.Key, a.Data)
		}
	}
}

// TestPlanChangesNothing checks that Plan reports without deleting.
func TestPlanChangesNothing(t *testing.T) {
	h := newHostile(t)
	c, err := New(Deps{State: h.state}, Options{Config: h.config(), Clock: clock.System(h.clock.Now), Wall: h.wall()})
	if err != nil {
		t.Fatal(err)
	}
	base0 := snapshot(t, h.base)
	plan, err := c.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if d := diffSnap(base0, snapshot(t, h.base)); d != "" {
		t.Errorf("Plan changed the tree:\n%s", d)
	}
	var remove int
	for _, d := range plan.Decisions {
		if d.Action == ActionRemove {
			remove++
		}
	}
	if want := 4 + len(h.unmounted()); remove != want {
		t.Errorf("plan has %d removals, want %d: %+v", remove, want, plan.Decisions)
	}
	if len(c.Status().Decisions) != 0 {
		t.Error("Plan must not change Status")
	}
	if _, err := json.Marshal(plan); err != nil {
		t.Errorf("plan does not marshal: %v", err)
	}
}

// TestRemovePodDirRefusesMounts drives the executor directly, without the
// planner's mountinfo check: statx alone must stop it before any delete.
func TestRemovePodDirRefusesMounts(t *testing.T) {
	if !canMount(t) {
		t.Skip()
	}
	root, outside := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(outside, "src", "keep.txt"), "keep\n")
	pod := filepath.Join(root, "ns_p_uid")
	writeFile(t, filepath.Join(pod, "a.log"), "a\n")                   // visited before the mount
	writeFile(t, filepath.Join(pod, "app", "deep", "mnt", "x"), "x\n") // covered by the mount
	writeFile(t, filepath.Join(pod, "zz", "z.log"), "z\n")             // visited after it
	bindMount(t, filepath.Join(outside, "src"), filepath.Join(pod, "app", "deep", "mnt"))
	before, outside0 := snapshot(t, root), snapshot(t, outside)

	fd, err := openRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	removed, err := removePodDir(fd, root, "ns_p_uid", false, time.Time{})
	if !errors.Is(err, errMount) || removed != (tally{}) {
		t.Fatalf("removePodDir = %+v, %v, want nothing removed and errMount", removed, err)
	}
	if d := diffSnap(before, snapshot(t, root)); d != "" {
		t.Errorf("tree changed:\n%s", d)
	}
	if d := diffSnap(outside0, snapshot(t, outside)); d != "" {
		t.Errorf("mount source changed:\n%s", d)
	}
}

// TestRemovePodDirNeverFollows removes a pod dir full of links pointing out
// and up, and checks every target survives.
func TestRemovePodDirNeverFollows(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(outside, "dir", "f"), "f\n")
	writeFile(t, filepath.Join(root, "sibling", "keep"), "keep\n")
	pod := filepath.Join(root, "ns_p_uid")
	writeFile(t, filepath.Join(pod, "app", "0.log"), strings.Repeat("x", 10000))
	symlink(t, filepath.Join(outside, "dir"), filepath.Join(pod, "app", "out"))
	symlink(t, "..", filepath.Join(pod, "up"))
	symlink(t, "../sibling", filepath.Join(pod, "app", "sib"))
	if err := unix.Mkfifo(filepath.Join(pod, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside0 := snapshot(t, outside)
	want := without(snapshot(t, root), "ns_p_uid")

	fd, err := openRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	removed, err := removePodDir(fd, root, "ns_p_uid", false, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// ns_p_uid, app, app/0.log, app/out, up, app/sib, fifo
	if removed.bytes < 10000 || removed.entries != 7 {
		t.Errorf("removed %+v, want >= 10000 bytes in 7 entries", removed)
	}
	if d := diffSnap(want, snapshot(t, root)); d != "" {
		t.Errorf("tree:\n%s", d)
	}
	if d := diffSnap(outside0, snapshot(t, outside)); d != "" {
		t.Errorf("outside changed:\n%s", d)
	}
}
