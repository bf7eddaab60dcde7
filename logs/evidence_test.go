package logs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"golang.org/x/sys/unix"
)

// These tests use only what the Cleaner had before the pod log dir's
// evidence (New, Clean, Plan, decisions and reason strings), and the fake
// state's SandboxLogDirs, so that they also run against d7dd547.

// backdate sets the mtime (and atime) of each path and of everything under
// it, without following symlinks, to ago before now.
func backdate(t *testing.T, ago time.Duration, paths ...string) {
	t.Helper()
	stamp(t, time.Now().Add(-ago), paths...)
}

// stamp sets the mtime (and atime) of each path and of everything under
// it, without following symlinks, to at.
func stamp(t *testing.T, at time.Time, paths ...string) {
	t.Helper()
	ts := unix.NsecToTimespec(at.UnixNano())
	for _, root := range paths {
		err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			t.Fatalf("backdate %s: %v", root, err)
		}
	}
}

// logTree is a LogDir and a PodLogDir in a temp dir, with a Cleaner on
// them whose clock the test moves.
type logTree struct {
	cfg Config
	st  *fakeState
	now time.Time
	c   *Cleaner
}

func newLogTree(t *testing.T, grace time.Duration) *logTree {
	t.Helper()
	base := t.TempDir()
	lt := &logTree{cfg: Config{LogDir: filepath.Join(base, "containers"), PodLogDir: filepath.Join(base, "pods"), PodLogGrace: grace},
		st: newFakeState(), now: t0}
	mkdirAll(t, lt.cfg.LogDir)
	mkdirAll(t, lt.cfg.PodLogDir)
	return lt
}

// start makes the Cleaner (again: a restart), keeping what it saw in
// file ("" nowhere).
func (lt *logTree) start(t *testing.T, file string) {
	t.Helper()
	dirs := NewPodDirs("")
	if file != "" {
		var err error
		if dirs, err = LoadPodDirs(file); err != nil {
			t.Fatal(err)
		}
	}
	deletes, _ := newDeletes(t, lstatChecker{})
	c, err := New(Deps{State: lt.st, Deletes: deletes, PodDirs: dirs},
		Options{Config: lt.cfg, Clock: clock.System(func() time.Time { return lt.now })})
	if err != nil {
		t.Fatal(err)
	}
	lt.c = c
}

// pass runs one pass and returns its decision on each entry by name.
func (lt *logTree) pass(t *testing.T) map[string]Decision {
	t.Helper()
	p, err := lt.c.Clean(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Decision{}
	for _, d := range p.Decisions {
		out[d.Name] = d
	}
	return out
}

// pod makes a pod dir with its container's log, and the kubelet's link to
// it; it returns the link's path and the log's.
func (lt *logTree) pod(t *testing.T, podDir, id string) (link, log string) {
	t.Helper()
	log = filepath.Join(lt.cfg.PodLogDir, podDir, "app", "0.log")
	writeFile(t, log, "log\n")
	link = filepath.Join(lt.cfg.LogDir, podDir+"_app-"+id+".log")
	symlink(t, log, link)
	return link, log
}

// oldLink makes a link, an hour old, into a pod dir that does not exist
// (a pod deleted while the agent was away, or before it was installed).
func (lt *logTree) oldLink(t *testing.T, podDir, id string) string {
	t.Helper()
	link := filepath.Join(lt.cfg.LogDir, podDir+"_app-"+id+".log")
	symlink(t, filepath.Join(lt.cfg.PodLogDir, podDir, "app", "0.log"), link)
	backdate(t, time.Hour, link)
	return link
}

// TestDanglingLinksJudgedByEvidence: a link whose target is absent from a
// pod log dir shown to be the kubelet's is dangling even if its pod dir
// was never seen: shown by a log dir the watched CRI gave a sandbox, a
// link of a container containerd knows, or a live kubelet link (which
// shows the kubelet writes there, not whose containers they are: a link
// of a container containerd does not know is then kept, as it may be
// another containerd's, still running). With nothing shown, both are
// kept (pod-log-dir-unverified). On d7dd547 every link into a pod dir
// never seen was kept (target-unseen): after a restart, on a first
// install, 1,960 in a 7-minute soak.
func TestDanglingLinksJudgedByEvidence(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cri: the live pod's sandbox log dir is known; known: its
		// container is known (running); live: its link is there.
		cri, known, live bool
		// exited, unknown: whether the exited container's and the unknown
		// container's links go on the first pass.
		exited, unknown bool
	}{
		{"a sandbox's log dir", true, false, false, true, true},
		{"a known container's link", false, true, true, true, true},
		{"a live link of an unknown container", false, false, true, true, false},
		{"nothing", false, false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt := newLogTree(t, time.Minute)
			live := cid("a1")
			link, _ := lt.pod(t, "ns_live_u9", live)
			if !tc.live {
				if err := os.Remove(link); err != nil {
					t.Fatal(err)
				}
			}
			if tc.known {
				lt.st.setContainer(live, true)
			}
			if tc.cri {
				lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
			}
			lt.st.setPod("u9", fakePod{alive: true})
			exited, unknown := cid("e1"), cid("f1")
			lt.st.setContainer(exited, false)
			exitedLink, unknownLink := lt.oldLink(t, "ns_old_u1", exited), lt.oldLink(t, "ns_old_u2", unknown)
			lt.start(t, "")

			got := lt.pass(t)
			for _, l := range []struct {
				path string
				gone bool
			}{{exitedLink, tc.exited}, {unknownLink, tc.unknown}} {
				if exists(l.path) == l.gone {
					d := got[filepath.Base(l.path)]
					t.Errorf("%s: gone %v, want %v (%s %s: %s)", filepath.Base(l.path), !exists(l.path), l.gone, d.Action, d.Reason, d.Detail)
				}
				if d := got[filepath.Base(l.path)]; !l.gone && d.Reason != "pod-log-dir-unverified" {
					t.Errorf("%s kept for %s, want pod-log-dir-unverified", filepath.Base(l.path), d.Reason)
				}
			}
			// Kept ones stay kept, however long.
			lt.now = lt.now.Add(24 * time.Hour)
			lt.pass(t)
			if exists(exitedLink) != !tc.exited || exists(unknownLink) != !tc.unknown {
				t.Errorf("a day later: exited link there %v, unknown link there %v", exists(exitedLink), exists(unknownLink))
			}
		})
	}
}

// TestUnknownContainersLinkGraceFromItsMaking: in a pod log dir shown to
// hold the watched containerd's pods, the dangling link of a container it
// does not know waits --pod-log-grace from when the link was made, or
// from when the agent first saw it if that is earlier: an old link goes at
// once (a first install), a new one waits the grace. d7dd547 kept both
// (target-unseen).
func TestUnknownContainersLinkGraceFromItsMaking(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	lt.pod(t, "ns_live_u9", cid("a1"))
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
	lt.st.setPod("u9", fakePod{alive: true})
	old := lt.oldLink(t, "ns_old_u1", cid("f1"))
	young := filepath.Join(lt.cfg.LogDir, "ns_new_u2_app-"+cid("f2")+".log")
	symlink(t, filepath.Join(lt.cfg.PodLogDir, "ns_new_u2", "app", "0.log"), young)
	lt.start(t, "")

	got := lt.pass(t)
	if exists(old) {
		t.Errorf("an hour-old link of an unknown container kept: %+v", got[filepath.Base(old)])
	}
	if d := got[filepath.Base(young)]; !exists(young) || d.Action != ActionWait {
		t.Errorf("a link made now: there %v, %s %s; want it waiting its grace", exists(young), d.Action, d.Reason)
	}
	lt.now = lt.now.Add(time.Minute)
	lt.pass(t)
	if exists(young) {
		t.Error("the new link is kept past its grace")
	}
}

// TestEvidenceSurvivesARestart: the pod log dir shown to hold the watched
// containerd's pods stays shown across a restart (poddirs.json, for the
// same directory): after the pods went while the agent was away, leaving
// their links dangling into dirs it never saw, those links go though no
// pod is left to show it again. A lost file is no evidence: they stay.
// d7dd547 kept them in both cases (target-unseen).
func TestEvidenceSurvivesARestart(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "poddirs.json kept", true: "poddirs.json lost"}[lost], func(t *testing.T) {
			lt := newLogTree(t, time.Minute)
			file := filepath.Join(t.TempDir(), PodDirsFile)
			lt.pod(t, "ns_live_u9", cid("a1"))
			lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
			lt.st.setPod("u9", fakePod{alive: true})
			lt.start(t, file)
			lt.pass(t)

			// While the agent is away the pod goes and its dir with it, and
			// pods made and deleted meanwhile leave links dangling into dirs
			// the agent never saw (the kubelet removed their dirs, not yet
			// their links).
			if err := os.RemoveAll(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9")); err != nil {
				t.Fatal(err)
			}
			lt.st.setLogDirs()
			lt.st.setPod("u9", fakePod{goneSince: lt.now})
			links := []string{lt.oldLink(t, "ns_a_u1", cid("f1")), lt.oldLink(t, "ns_b_u2", cid("f2"))}
			if lost {
				if err := os.Remove(file); err != nil {
					t.Fatal(err)
				}
			}
			lt.now = lt.now.Add(time.Hour)
			lt.start(t, file)
			got := lt.pass(t)
			for _, l := range links {
				if exists(l) != lost {
					d := got[filepath.Base(l)]
					t.Errorf("%s there %v, want %v (%s %s: %s)", filepath.Base(l), exists(l), lost, d.Action, d.Reason, d.Detail)
				}
			}
		})
	}
}

// TestAnotherContainerdsPodDirsAreKept: the pod log dir of another
// containerd's kubelet (the agent watches Docker's containerd on a k3s
// node, or a wrong --containerd-address): its links resolve into it, so
// the kubelet writes there, but no pod of the watched containerd has its
// logs there. A pod dir of a pod the watched containerd does not know is
// kept, however long it is quiet, and so is the link of a container it
// does not know, dangling in a rotation. d7dd547 removed the pod dir after
// --pod-log-grace (pod-unknown), while it was written every second.
func TestAnotherContainerdsPodDirsAreKept(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	link, log := lt.pod(t, "ns_web_u1", cid("a1"))
	other, _ := lt.pod(t, "ns_job_u2", cid("a2"))
	lt.start(t, "")
	lt.pass(t)
	for range 3 {
		lt.now = lt.now.Add(time.Hour)
		for _, p := range []string{log, filepath.Join(lt.cfg.PodLogDir, "ns_job_u2")} {
			if !exists(p) {
				t.Fatalf("%s removed: the pod log dir holds no pod of the watched containerd", p)
			}
		}
		writeFile(t, log, "log\nmore\n")                                     // written now
		backdate(t, time.Hour, filepath.Join(lt.cfg.PodLogDir, "ns_job_u2")) // quiet for an hour
		lt.pass(t)
	}
	for _, p := range []string{filepath.Join(lt.cfg.PodLogDir, "ns_web_u1"), filepath.Join(lt.cfg.PodLogDir, "ns_job_u2"), link, other} {
		if !exists(p) {
			t.Errorf("%s removed: the pod log dir holds no pod of the watched containerd", p)
		}
	}
	// The rotation window of a container the watched containerd does not
	// know: its link dangles for a moment.
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	got := lt.pass(t)
	if !exists(link) {
		t.Errorf("the link of a container another containerd runs removed while its log rotated (%s)", got[filepath.Base(link)].Reason)
	}
}

// TestOrphanedPodDirWaitsUntilQuiet: in a pod log dir that holds the
// watched containerd's pods, the dir of a pod it does not know goes only
// once nothing below it changed for --pod-log-grace (mtime): one written
// now stays, one quiet for an hour goes at once (a first install, a
// restart), one written again right before the removal stays. d7dd547
// removed a written one after the grace from first seen, and kept a quiet
// one a grace after a restart.
func TestOrphanedPodDirWaitsUntilQuiet(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	lt.pod(t, "ns_live_u9", cid("a1"))
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
	lt.st.setPod("u9", fakePod{alive: true})
	written := filepath.Join(lt.cfg.PodLogDir, "ns_written_u1")
	quiet := filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2")
	writeFile(t, filepath.Join(written, "app", "0.log"), "log\n")
	writeFile(t, filepath.Join(quiet, "app", "0.log"), "log\n")
	backdate(t, time.Hour, quiet)
	lt.start(t, "")
	lt.pass(t)
	if exists(quiet) {
		t.Error("a pod dir quiet for an hour, of a pod the watched containerd does not know, kept")
	}
	for range 3 {
		lt.now = lt.now.Add(2 * time.Minute)
		writeFile(t, filepath.Join(written, "app", "0.log"), "log\nmore\n")
		got := lt.pass(t)
		if !exists(written) {
			t.Fatalf("a pod dir written now removed (%s)", got[filepath.Base(written)].Reason)
		}
	}
}

// TestKeptForInputsAndProblems: what a plan keeps because an input is
// unknown (here the pod log dir not verified) is counted by kind and
// reason (the lead's over-keep gauge), said in one Problems line (/readyz,
// plan), and the plan says what the pod log dir shows.
func TestKeptForInputsAndProblems(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	exited := cid("e1")
	lt.st.setContainer(exited, false)
	lt.oldLink(t, "ns_old_u1", exited)
	lt.oldLink(t, "ns_old_u2", cid("f2"))
	agedDir(t, filepath.Join(lt.cfg.PodLogDir, "ns_orphan_u3"), time.Hour, "app/0.log")
	lt.start(t, "")
	p, err := lt.c.Clean(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	kept := p.KeptForInputs()
	if kept[KindSymlink][ReasonUnverified] != 2 || kept[KindPodDir][ReasonUnverified] != 1 || len(kept) != 2 {
		t.Errorf("kept for inputs %v, want 2 links and 1 pod dir, %s", kept, ReasonUnverified)
	}
	if p.PodLogDir.By != Unverified || p.PodLogDir.Detail == "" {
		t.Errorf("plan's pod log dir %+v, want unverified, saying why", p.PodLogDir)
	}
	var lines []string
	for _, l := range lt.c.Problems() {
		if strings.Contains(l, string(ReasonUnverified)) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "2 dangling log links and 1 orphaned pod log dirs kept") {
		t.Errorf("problems %q, want one line naming 2 links and 1 pod dir", lt.c.Problems())
	}

	// Shown by a sandbox's log dir: nothing kept for it, nothing to say.
	agedDir(t, filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"), time.Hour, "app/0.log")
	lt.st.setPod("u9", fakePod{alive: true})
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
	if p, err = lt.c.Clean(context.Background()); err != nil {
		t.Fatal(err)
	}
	if kept := p.KeptForInputs(); len(kept) != 0 || len(lt.c.Problems()) != 0 || p.PodLogDir.By != VerifiedByCRI {
		t.Errorf("verified: kept for inputs %v, problems %q, pod log dir %+v", kept, lt.c.Problems(), p.PodLogDir)
	}
}

// TestEvidenceAgainst: the watched CRI's sandboxes writing their logs
// elsewhere (a --pod-log-dir that is not its kubelet's: none of their
// dirs is here, by path or by name) outweigh what an earlier pass showed: nothing of the watched containerd's is removed
// meanwhile. Another directory at the path (PodDirs' identity) holds no
// evidence at all.
func TestEvidenceAgainst(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	file := filepath.Join(t.TempDir(), PodDirsFile)
	agedDir(t, filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"), time.Hour, "app/0.log")
	lt.st.setPod("u9", fakePod{alive: true})
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"))
	lt.start(t, file)
	if p, _ := lt.c.Clean(context.Background()); p.PodLogDir.By != VerifiedByCRI {
		t.Fatalf("pod log dir %+v, want verified by CRI", p.PodLogDir)
	}
	orphan := filepath.Join(lt.cfg.PodLogDir, "ns_orphan_u3")
	agedDir(t, orphan, time.Hour, "app/0.log")
	lt.st.setLogDirs("/elsewhere/pods/ns_web_u8")
	p, _ := lt.c.Clean(context.Background())
	if !exists(orphan) || p.PodLogDir.By != Unverified || !strings.Contains(p.PodLogDir.Detail, "/elsewhere/pods/ns_web_u8") {
		t.Errorf("CRI's pods write elsewhere: orphan there %v, pod log dir %+v", exists(orphan), p.PodLogDir)
	}

	// The saved evidence is for that directory only.
	lt.st.setLogDirs()
	if err := os.RemoveAll(lt.cfg.PodLogDir); err != nil {
		t.Fatal(err)
	}
	mkdirAll(t, lt.cfg.PodLogDir)
	agedDir(t, orphan, time.Hour, "app/0.log")
	lt.start(t, file)
	if p, _ := lt.c.Clean(context.Background()); !exists(orphan) || p.PodLogDir.By != Unverified {
		t.Errorf("another directory at the path: orphan there %v, pod log dir %+v", exists(orphan), p.PodLogDir)
	}
}

// TestPodDirWrittenBeforeItsRemovalIsKept: the removal's own walk reads
// the change times again right before it unlinks anything: a file written
// after the plan keeps the whole dir, untouched.
func TestPodDirWrittenBeforeItsRemovalIsKept(t *testing.T) {
	base := t.TempDir()
	pod := filepath.Join(base, "ns_p_uid1")
	agedDir(t, pod, time.Hour, "app/0.log", "app/1.log")
	fd, err := openRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	changed, err := podDirChanged(fd, base, "ns_p_uid1")
	if err != nil || time.Since(changed) < 59*time.Minute {
		t.Fatalf("changed %v (%v), want an hour ago", changed, err)
	}
	writeFile(t, filepath.Join(pod, "app", "1.log"), "written now\n")
	before := snapshot(t, base)
	removed, err := removePodDir(fd, base, "ns_p_uid1", false, time.Now().Add(-time.Minute))
	if !errors.Is(err, errRecent) || removed.entries != 0 {
		t.Errorf("removal of a dir written now: %+v, %v; want nothing removed, errRecent", removed, err)
	}
	if d := diffSnap(before, snapshot(t, base)); d != "" {
		t.Errorf("the dir changed:\n%s", d)
	}
	if removed, err = removePodDir(fd, base, "ns_p_uid1", false, time.Now().Add(time.Minute)); err != nil || exists(pod) {
		t.Errorf("removal once quiet: %+v, %v, there %v", removed, err, exists(pod))
	}
}
