package projection

import (
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func apply(s *State, evs ...events.Event) *State {
	for _, ev := range evs {
		s.Apply(ev)
	}
	return s
}

func TestImageNamesShareOneTarget(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: "example.test/app:1", Digest: "sha256:a", Size: 100},
		events.ImageUpserted{At: at(5), Name: "sha256:cfg", Digest: "sha256:a", Labels: map[string]string{LabelPinned: LabelPinnedValue}},
	)
	img := s.Images["sha256:a"]
	if img == nil || len(s.Images) != 1 || len(img.Names) != 2 {
		t.Fatalf("want one image with two names, got %+v", s.Images)
	}
	if !img.FirstSeen.Time().Equal(at(0)) || img.Size != 100 || !img.Pinned() {
		t.Fatalf("first seen %v size %d pinned %v", img.FirstSeen, img.Size, img.Pinned())
	}
	// Retag one name elsewhere: the image keeps the other name and its history.
	s.Apply(events.ImageUpserted{At: at(10), Name: "example.test/app:1", Digest: "sha256:b"})
	if got := s.Images["sha256:a"]; got == nil || len(got.Names) != 1 || !got.FirstSeen.Time().Equal(at(0)) {
		t.Fatalf("after retag: %+v", got)
	}
	s.Apply(events.ImageDeleted{At: at(11), Name: "sha256:cfg"})
	if _, ok := s.Images["sha256:a"]; ok {
		t.Fatal("image without names must be dropped")
	}
	if s.Names["example.test/app:1"] != "sha256:b" {
		t.Fatalf("names index: %v", s.Names)
	}
}

// TestImageUseByContentKeys: containers that hold an image by its config
// digest (CRI's image id) or by its chain id are its users, found without an
// allocation per lookup (an image plan asks this of every image).
func TestImageUseByContentKeys(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: "img:1", Digest: "sha256:a", ConfigDigest: "sha256:cfg", ChainID: "sha256:chain"},
		events.ImageUpserted{At: at(0), Name: "img:2", Digest: "sha256:b", ConfigDigest: "sha256:cfg2", ChainID: "sha256:chain2"},
		events.ContainerUpserted{At: at(10), ID: "by-id", Image: "other:1", ImageID: "sha256:cfg"},
		events.ContainerUpserted{At: at(10), ID: "by-chain", Image: "other:2", RootChain: "sha256:chain"},
		events.ContainerUpserted{At: at(10), ID: "volume", Image: "other:3", VolumeImageIDs: []string{"sha256:cfg"}},
	)
	img, idle := s.Images["sha256:a"], s.Images["sha256:b"]
	if got := s.ImageUsers(img); !slices.Equal(got, []string{"by-chain", "by-id", "volume"}) {
		t.Fatalf("users %v, want by-chain, by-id, volume", got)
	}
	if got := s.ImageUsers(idle); got != nil || s.InUse("sha256:b") || !s.InUse("sha256:a") {
		t.Fatalf("idle image: users %v, in use %v; held image in use %v", got, s.InUse("sha256:b"), s.InUse("sha256:a"))
	}
	if n := testing.AllocsPerRun(100, func() { s.LastUsed(img, at(100)); s.LastUsed(idle, at(100)) }); n != 0 {
		t.Fatalf("LastUsed allocates %v times per call pair, want 0", n)
	}
}

func TestLastUsedFollowsUsers(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: "img:1", Digest: "sha256:a"},
		events.ContainerUpserted{At: at(10), ID: "c1", Image: "img:1"},
		events.TaskStarted{At: at(11), ContainerID: "c1", Pid: 42},
		events.ContainerUpserted{At: at(20), ID: "c2", Image: "img:1"},
	)
	img := s.Images["sha256:a"]
	if !s.InUse("sha256:a") || !s.LastUsed(img, at(100)).Equal(at(100)) {
		t.Fatalf("in use image must be used now: %v", s.LastUsed(img, at(100)))
	}
	s.Apply(events.TaskExited{At: at(30), ContainerID: "c1", ExitedAt: at(29), ExitStatus: 1})
	if !s.InUse("sha256:a") {
		t.Fatal("an exited container still uses its image")
	}
	s.Apply(events.ContainerDeleted{At: at(40), ID: "c1"})
	s.Apply(events.ContainerDeleted{At: at(50), ID: "c2"})
	if s.InUse("sha256:a") || !s.LastUsed(img, at(100)).Equal(at(50)) {
		t.Fatalf("last used = %v, want the time the last user went away", s.LastUsed(img, at(100)))
	}
	// A late duplicate delete cannot rewind history.
	s.Apply(events.ContainerDeleted{At: at(45), ID: "c2"})
	if !img.LastUsed.Time().Equal(at(50)) {
		t.Fatalf("last used rewound to %v", img.LastUsed)
	}
}

func TestContainerLifecycle(t *testing.T) {
	s := apply(New(), events.ContainerUpserted{At: at(0), ID: "c", Image: "x"})
	c := s.Containers["c"]
	if c.State != StateCreated || c.Dead() {
		t.Fatalf("never started must not be dead: %+v", c)
	}
	s.Apply(events.TaskStarted{At: at(1), ContainerID: "c", Pid: 7})
	s.Apply(events.TaskExited{At: at(3), ContainerID: "c", Pid: 7, ExitedAt: at(2), ExitStatus: 3})
	if !c.Dead() || !c.ExitedAt.Time().Equal(at(2)) || c.ExitStatus != 3 {
		t.Fatalf("exit: %+v", c)
	}
	// /tasks/delete repeats the exit: the first exit time stays.
	s.Apply(events.TaskExited{At: at(4), ContainerID: "c", Pid: 7, ExitedAt: at(4)})
	if !c.ExitedAt.Time().Equal(at(2)) {
		t.Fatalf("duplicate exit moved exit time to %v", c.ExitedAt)
	}
	// An exit that overtook its own start (shim and daemon clocks differ):
	// the late start, even stamped after the exit, changes nothing.
	s.Apply(events.ContainerUpserted{At: at(0), ID: "quick", Image: "x"})
	s.Apply(events.TaskExited{At: at(2), ContainerID: "quick", Pid: 9, ExitedAt: at(1), ExitStatus: 3})
	s.Apply(events.TaskStarted{At: at(3), ContainerID: "quick", Pid: 9})
	if q := s.Containers["quick"]; q.State != StateExited || q.ExitStatus != 3 {
		t.Fatalf("late start resurrected %+v", q)
	}
	// A start stamped later than its own exit, arriving first.
	s.Apply(events.ContainerUpserted{At: at(0), ID: "skew", Image: "x"})
	s.Apply(events.TaskStarted{At: at(5), ContainerID: "skew", Pid: 11})
	s.Apply(events.TaskExited{At: at(6), ContainerID: "skew", Pid: 11, ExitedAt: at(4)})
	if k := s.Containers["skew"]; k.State != StateExited {
		t.Fatalf("exit lost to clock skew: %+v", k)
	}
	// Restarted, then a stale exit of the previous run arrives.
	s.Apply(events.TaskStarted{At: at(10), ContainerID: "c", Pid: 8})
	s.Apply(events.TaskExited{At: at(11), ContainerID: "c", Pid: 7, ExitedAt: at(2)})
	if c.State != StateRunning {
		t.Fatalf("stale exit applied: %+v", c)
	}
}

func TestPodsAndEvictUnits(t *testing.T) {
	s := apply(New(),
		events.ContainerUpserted{At: at(0), ID: "sb", CRIKind: KindSandbox, PodUID: "uid-1", PodName: "web", PodNamespace: "default"},
		events.ContainerUpserted{At: at(1), ID: "app", CRIKind: KindContainer, PodUID: "uid-1", ContainerName: "app", SandboxID: "sb"},
		events.ContainerUpserted{At: at(2), ID: "native", Image: "x"},
	)
	if p := s.Pods["uid-1"]; p == nil || !p.Alive() || p.Name != "web" {
		t.Fatalf("pod: %+v", p)
	}
	if u := s.Containers["app"].EvictUnit(); u != "uid-1/app" {
		t.Fatalf("CRI evict unit %q", u)
	}
	if u := s.Containers["native"].EvictUnit(); u != "native" {
		t.Fatalf("native evict unit %q", u)
	}
	s.Apply(events.ContainerDeleted{At: at(9), ID: "sb"})
	if p := s.Pods["uid-1"]; p.Alive() || !p.GoneAt.Equal(at(9)) {
		t.Fatalf("pod after sandbox delete: %+v", p)
	}
	s.ForgetPodsGoneBefore(at(10))
	if len(s.Pods) != 0 {
		t.Fatal("gone pod not forgotten")
	}
}

// TestPodLogDirFromSandbox: a pod holds the log dir its sandbox was given
// (another sandbox without one keeps it), and a relist upserts a sandbox
// whose pod lacks the listed one (restored from a snapshot of format 3),
// once.
func TestPodLogDirFromSandbox(t *testing.T) {
	const dir = "/var/log/pods/default_web_uid-1"
	sb := events.ContainerUpserted{At: at(0), ID: "sb", CRIKind: KindSandbox, PodUID: "uid-1", PodName: "web", PodNamespace: "default", SandboxID: "sb"}
	withDir := sb
	withDir.LogDir = dir
	s := apply(New(), withDir, events.ContainerUpserted{At: at(1), ID: "sb2", CRIKind: KindSandbox, PodUID: "uid-1", PodName: "web",
		PodNamespace: "default", SandboxID: "sb2"})
	if p := s.Pods["uid-1"]; p == nil || p.LogDir != dir {
		t.Fatalf("pod: %+v, want log dir %s", p, dir)
	}
	s = apply(New(), sb, events.Synced{At: at(0)})
	listing := events.Listing{At: at(10), Containers: []events.ContainerUpserted{withDir}}
	evs := Reconcile(s, listing)
	if len(evs) != 2 || evs[0].Kind() != events.KindContainerUpserted {
		t.Fatalf("relist of a sandbox with a log dir the pod lacks: %v, want its upsert and synced", evs)
	}
	apply(s, evs...)
	if p := s.Pods["uid-1"]; p.LogDir != dir {
		t.Fatalf("after the relist: %+v", p)
	}
	if again := Reconcile(s, listing); len(again) != 1 {
		t.Fatalf("the same listing again: %v, want synced only", again)
	}
}

func TestReconcileRepairsMissedEvents(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: "keep:1", Digest: "sha256:k"},
		events.ImageUpserted{At: at(0), Name: "gone:1", Digest: "sha256:g"},
		events.ContainerUpserted{At: at(1), ID: "running", Image: "keep:1"},
		events.TaskStarted{At: at(1), ContainerID: "running"},
		events.ContainerUpserted{At: at(1), ID: "deleted", Image: "keep:1"},
	)
	listing := events.Listing{
		At: at(100),
		Images: []events.ImageUpserted{
			{Name: "keep:1", Digest: "sha256:k"},
			{Name: "new:1", Digest: "sha256:n", Size: 5},
		},
		Containers: []events.ContainerUpserted{
			{ID: "running", Image: "keep:1", ImageDigest: "sha256:k"},
			{ID: "fresh", Image: "new:1", ImageDigest: "sha256:n"},
		},
		Tasks: []events.Task{{ContainerID: "fresh", Status: events.TaskStopped, ExitedAt: at(90), ExitStatus: 2}},
	}
	evs := Reconcile(s, listing)
	want := []events.Kind{
		events.KindImageUpserted, events.KindImageDeleted, // new:1, gone:1
		events.KindContainerUpserted, events.KindTaskExited, // fresh (stopped)
		events.KindTaskExited,       // running: task vanished while we were away
		events.KindContainerDeleted, // deleted
		events.KindSynced,
	}
	var got []events.Kind
	for _, e := range evs {
		got = append(got, e.Kind())
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("reconcile kinds\n got %v\nwant %v", got, want)
	}
	apply(s, evs...)
	if !s.Synced || len(s.Images) != 2 || s.Containers["running"].State != StateExited || !s.Containers["fresh"].ExitedAt.Time().Equal(at(90)) {
		t.Fatalf("after reconcile: %+v", s)
	}
	if !s.Images["sha256:k"].FirstSeen.Time().Equal(at(0)) {
		t.Fatal("reconcile must keep first seen")
	}
	// Reconciling the same listing again changes nothing but Synced.
	if again := Reconcile(s, listing); len(again) != 1 {
		t.Fatalf("second reconcile not idempotent: %v", again)
	}
}

// TestReconcileTakesTheListingsExit: a relist converges to what containerd
// and CRI report, whatever the agent saw before: a container whose task
// is of unknown status (CRI could not tell yet) keeps its state, never an
// exit guessed; once CRI tells, the exit it reports replaces one the
// projection guessed or holds from an earlier run; the same listing again
// changes nothing (issue 34, item 7).
func TestReconcileTakesTheListingsExit(t *testing.T) {
	s := apply(New(),
		events.ImageUpserted{At: at(0), Name: "app:1", Digest: "sha256:a"},
		events.ContainerUpserted{At: at(1), ID: "window", Image: "app:1", CRIKind: KindContainer},
		events.TaskStarted{At: at(1), ContainerID: "window", Pid: 10},
		events.ContainerUpserted{At: at(1), ID: "guessed", Image: "app:1", CRIKind: KindContainer},
		events.TaskStarted{At: at(1), ContainerID: "guessed", Pid: 11},
		// The task went away unseen: the exit status was guessed.
		events.TaskExited{At: at(5), ContainerID: "guessed", ExitedAt: at(5), Collected: true},
		events.ContainerUpserted{At: at(1), ID: "rerun", Image: "app:1"},
		events.TaskStarted{At: at(1), ContainerID: "rerun", Pid: 12},
		events.TaskExited{At: at(2), ContainerID: "rerun", Pid: 12, ExitStatus: 1, ExitedAt: at(2)},
	)
	containers := []events.ContainerUpserted{
		{ID: "window", Image: "app:1", ImageDigest: "sha256:a", CRIKind: KindContainer},
		{ID: "guessed", Image: "app:1", ImageDigest: "sha256:a", CRIKind: KindContainer},
		{ID: "rerun", Image: "app:1", ImageDigest: "sha256:a"},
	}
	for _, c := range containers {
		c.At = at(1)
		s.Apply(c)
	}
	// CRI's window: it deleted window's task, has not recorded the exit.
	window := events.Listing{At: at(10), Containers: containers, Tasks: []events.Task{
		{ContainerID: "window", Status: events.TaskUnknown},
		{ContainerID: "guessed", Status: events.TaskStopped, ExitStatus: 2, ExitedAt: at(4)},
		{ContainerID: "rerun", Pid: 13, Status: events.TaskStopped, ExitStatus: 1, ExitedAt: at(8)}, // restarted and exited while away
	}}
	apply(s, Reconcile(s, window)...)
	if c := s.Containers["window"]; c.State != StateRunning {
		t.Errorf("window: %s (exit %d), want running until CRI tells", c.State, c.ExitStatus)
	}
	if c := s.Containers["guessed"]; c.State != StateExited || c.ExitStatus != 2 || !c.ExitedAt.Time().Equal(at(4)) {
		t.Errorf("guessed: %s exit %d at %v, want exited 2 at %v as CRI reports", c.State, c.ExitStatus, c.ExitedAt.Time(), at(4))
	}
	if c := s.Containers["rerun"]; c.State != StateExited || c.Pid != 13 || !c.ExitedAt.Time().Equal(at(8)) {
		t.Errorf("rerun: %s pid %d at %v, want the run containerd reports, pid 13 at %v", c.State, c.Pid, c.ExitedAt.Time(), at(8))
	}
	told := events.Listing{At: at(11), Containers: containers, Tasks: []events.Task{
		{ContainerID: "window", Status: events.TaskStopped, ExitStatus: 2, ExitedAt: at(9)},
		{ContainerID: "guessed", Status: events.TaskStopped, ExitStatus: 2, ExitedAt: at(4)},
		{ContainerID: "rerun", Pid: 13, Status: events.TaskStopped, ExitStatus: 1, ExitedAt: at(8)},
	}}
	apply(s, Reconcile(s, told)...)
	if c := s.Containers["window"]; c.State != StateExited || c.ExitStatus != 2 || !c.ExitedAt.Time().Equal(at(9)) {
		t.Errorf("window: %s exit %d at %v, want exited 2 at %v", c.State, c.ExitStatus, c.ExitedAt.Time(), at(9))
	}
	if again := Reconcile(s, told); len(again) != 1 {
		t.Errorf("the same listing again: %v, want only Synced", again)
	}
}

func TestStoreRestoresExactly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLive(LiveOptions{Store: st, SnapshotEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	l.Apply(
		events.ImageUpserted{At: at(0), Name: "a:1", Digest: "sha256:a", Size: 10, Labels: map[string]string{"k": "v"}},
		events.ContainerUpserted{At: at(1), ID: "c", Image: "a:1"},
		events.TaskStarted{At: at(2), ContainerID: "c"},
		events.TaskExited{At: at(3), ContainerID: "c", ExitedAt: at(3)},
		events.ContainerDeleted{At: at(4), ID: "c"},
		events.Synced{At: at(5)},
	)
	before := l.Snapshot()
	if n, _ := st.JournalLen(); n >= 6 {
		t.Fatalf("journal not compacted: %d entries", n)
	}
	st.Close() // as after kill -9: no final snapshot

	st2, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	l2, err := NewLive(LiveOptions{Store: st2})
	if err != nil {
		t.Fatal(err)
	}
	after := l2.Snapshot()
	if after.Synced {
		t.Fatal("a restored state must wait for a reconcile")
	}
	after.Synced = before.Synced
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("restored state differs\nbefore %+v\nafter  %+v", before.Images["sha256:a"], after.Images["sha256:a"])
	}
}

// TestStoreGapKeepsPositions: a batch that failed to journal leaves a gap;
// after a restart new entries go after the last key, so nothing journaled
// is overwritten and a second restart still replays everything.
func TestStoreGapKeepsPositions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	// Seq 1 journaled, seq 2 lost (the append failed), seq 3 journaled.
	if err := st.Append(1, []events.Event{events.ImageUpserted{At: at(0), Name: "a:1", Digest: "sha256:a"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Append(3, []events.Event{events.ImageUpserted{At: at(2), Name: "c:1", Digest: "sha256:c"}}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLive(LiveOptions{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if seq := l.Snapshot().Seq; seq != 3 {
		t.Fatalf("seq after replay = %d, want 3 (the last key)", seq)
	}
	l.Apply(events.ImageUpserted{At: at(3), Name: "d:1", Digest: "sha256:d"})
	st.Close()

	st, err = OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	res, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"sha256:a", "sha256:c", "sha256:d"} {
		if res.State.Images[d] == nil {
			t.Errorf("image %s lost across restarts", d)
		}
	}
}

// TestReconcileDeletesInOrder: what a listing no longer shows is deleted
// in sorted order (the journal is deterministic), whatever the map order.
func TestReconcileDeletesInOrder(t *testing.T) {
	s := New()
	ids := []string{"c-q", "c-b", "c-z", "c-a", "c-m", "c-k", "c-d", "c-x"}
	for _, id := range ids {
		s.Apply(events.ContainerUpserted{At: at(0), ID: id})
		s.Apply(events.ImageUpserted{At: at(0), Name: "img-" + id, Digest: "sha256:" + id})
	}
	var images, containers []string
	for _, ev := range Reconcile(s, events.Listing{At: at(1)}) {
		switch e := ev.(type) {
		case events.ImageDeleted:
			images = append(images, e.Name)
		case events.ContainerDeleted:
			containers = append(containers, e.ID)
		}
	}
	if len(containers) != len(ids) || !slices.IsSorted(containers) || len(images) != len(ids) || !slices.IsSorted(images) {
		t.Fatalf("deletions %v, %v: want all, sorted", images, containers)
	}
}

// TestDeadIndexFollowsContainers: through random creates, starts, exits
// (of this run and of earlier ones), deletes and re-creates of a few
// containers, the dead index holds exactly the dead ones, also in a clone
// and in a state restored from its snapshot.
func TestDeadIndexFollowsContainers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := New()
	ids := []string{"a", "b", "c", "d"}
	for i := range 3000 {
		id, pid, now := ids[r.IntN(len(ids))], uint32(1+r.IntN(3)), at(i)
		switch r.IntN(5) {
		case 0:
			s.Apply(events.ContainerUpserted{At: now, ID: id, Image: "x:1"})
		case 1:
			s.Apply(events.TaskStarted{At: now, ContainerID: id, Pid: pid})
		case 2:
			s.Apply(events.TaskExited{At: now, ContainerID: id, Pid: pid, ExitedAt: now})
		case 3:
			s.Apply(events.TaskExited{At: now, ContainerID: id, Pid: pid, ExitedAt: now, Collected: true})
		case 4:
			s.Apply(events.ContainerDeleted{At: now, ID: id})
		}
		checkDeadIndex(t, s)
	}
	checkDeadIndex(t, s.Clone())
	back, err := decodeSnapshot(encodeSnapshot(s))
	if err != nil {
		t.Fatal(err)
	}
	back.fill()
	checkDeadIndex(t, back)
}

// TestReconcileExitNeverBeforeTheStartSeen: a container the agent saw
// start at 50 s is listed exited with a stamp from an hour before (the
// host's clock was stepped back when containerd stamped it, and the
// agent restarted before it saw the exit): the stamp says nothing, and
// the listing's time stands for the exit, so that it does not look an
// hour older.
func TestReconcileExitNeverBeforeTheStartSeen(t *testing.T) {
	s := apply(New(),
		events.ContainerUpserted{At: at(10), ID: "behind", Image: "keep:1"},
		events.TaskStarted{At: at(50), ContainerID: "behind"},
		events.ContainerUpserted{At: at(10), ID: "old", Image: "keep:1"},
	)
	listing := events.Listing{At: at(100),
		Containers: []events.ContainerUpserted{{ID: "behind", Image: "keep:1"}, {ID: "old", Image: "keep:1"}},
		Tasks: []events.Task{{ContainerID: "behind", Status: events.TaskStopped, ExitedAt: at(51).Add(-time.Hour)},
			{ContainerID: "old", Status: events.TaskStopped, ExitedAt: at(60)}}}
	apply(s, Reconcile(s, listing)...)
	if got := s.Containers["behind"].ExitedAt.Time(); !got.Equal(at(100)) {
		t.Errorf("exit listed an hour before the start seen at %s: taken as %s, want the listing's time", at(50), got)
	}
	if got := s.Containers["old"].ExitedAt.Time(); !got.Equal(at(60)) {
		t.Errorf("an exit after the agent first saw the container: %s, want the listing's %s", got, at(60))
	}
}
