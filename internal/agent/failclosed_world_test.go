package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
)

// The decision table's world: the real planners, executors and delete
// transaction, over a real projection, with the node adapter faked (its
// own tests and the end-to-end tests show what it answers), and the
// inputs the agent reads itself (the fleet keep list, the pod log dir,
// the clock) read by the agent's own code. Three functions here are the
// seams to the agent's code: fleetKeepFor, podSignFor, agentClock; a
// branch that changes how the agent reads an input changes them, not the
// table.

// keepReader is the fleet keep list as image GC reads it.
type keepReader = func() gc.KeepList

// fleetKeepFor is the fleet keep list as image GC reads it from the
// agent's reader, restored from stateDir (none saved there: never read),
// for an agent started at now with --keep-list-wait wait.
func fleetKeepFor(stateDir string, wait time.Duration, now func() time.Time) keepReader {
	return loadFleetKeep(stateDir, "default", testKeepSource, wait, now, zerolog.Nop()).KeepList
}

// knownFleetKeep is a fleet keep list NATS confirmed at now.
func knownFleetKeep(now time.Time, patterns ...string) keepReader {
	return func() gc.KeepList { return gc.KeepList{Input: gc.KnownInput(now), Patterns: patterns} }
}

// saveFleetKeep writes the list an agent saved in stateDir, confirmed by
// NATS at confirmed.
func saveFleetKeep(t *testing.T, stateDir string, confirmed time.Time, patterns ...string) {
	t.Helper()
	saveFleetKeepFrom(t, stateDir, testKeepSource, confirmed, patterns...)
}

// saveFleetKeepFrom is saveFleetKeep of a list read from source (keepSource).
func saveFleetKeepFrom(t *testing.T, stateDir, source string, confirmed time.Time, patterns ...string) {
	t.Helper()
	b, err := json.Marshal(keepDoc{Lists: map[string]natsbus.KeepList{natsbus.KeepAllKey: {Patterns: patterns}}, ConfirmedAt: confirmed,
		Source: source})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, KeepListFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// podSignFor is the deleted-pod sign as the agent reads it from the pod
// log dir dir: what its log cleaner saw of the dir (logs.PodDirs), read
// here before each plan as the cleaner reads it on every change.
func podSignFor(dir string) gc.PodLogDir { return &readPodDirs{dir: dir, dirs: logs.NewPodDirs("")} }

// readPodDirs reads its dir whenever a plan asks for its state.
type readPodDirs struct {
	dir  string
	dirs *logs.PodDirs
}

func (r *readPodDirs) Input(now time.Time) gc.Input {
	r.dirs.Read(r.dir, now)
	return r.dirs.Input(now)
}

func (r *readPodDirs) Gone(uid, namespace, name string) (time.Time, bool) {
	return r.dirs.Gone(uid, namespace, name)
}

// agentClock is the agent's clock, continued from the time saved in file
// (as run does at start), with the wall clock skew away from the host's.
func agentClock(skew time.Duration, file string) *clock.Clock {
	s := &clock.Skew{}
	s.Set(skew)
	c, _ := clock.Continue(s, file)
	return c
}

// t0 of every world: the decision time, unless a clock row says otherwise.
var tableNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

const mib = 1 << 20

// tableImage is one image of the node: its names now, what the node
// adapter says holds it (or the error it gives), and the bytes its
// delete frees.
type tableImage struct {
	names      []string
	holders    []gc.Holder
	holdersErr error
	removeErr  error // the delete call fails
	goneErr    error // and the node cannot tell what happened
	frees      uint64
	// born is each name's record's creation time (zero when not set).
	born map[string]time.Time
	// The CRI removal (node.Runtime.RemoveImage): criNames are the names
	// CRI knows, which its RemoveImage removes, all of them, whatever the
	// re-check saw; madeDuring are names a pull makes on the image during
	// that call (the re-check never saw them), made at madeAt; rereadErr
	// fails the read of the names left after CRI's removal.
	criNames   []string
	madeDuring []string
	madeAt     time.Time
	rereadErr  error
	// asked are the names (with their records' creation times) the
	// executor asked the node to delete.
	asked []gc.ImageName
}

// tableNode is the node adapter for image rows.
type tableNode struct {
	mu      sync.Mutex
	images  map[string]*tableImage // by digest
	removed []string
	disk    *tableDisk
}

func (n *tableNode) ImageNames(_ context.Context, _, digest string) ([]gc.ImageName, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []gc.ImageName
	if img := n.images[digest]; img != nil {
		for _, name := range slices.Sorted(slices.Values(img.names)) {
			out = append(out, gc.ImageName{Name: name, Created: img.born[name]})
		}
	}
	return out, nil
}

func (n *tableNode) ImageHolders(_ context.Context, _ string, ref gc.ImageRef) ([]gc.Holder, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	img := n.images[ref.Digest]
	if img == nil {
		return nil, nil
	}
	return img.holders, img.holdersErr
}

// RemoveImage deletes the names it is given, as the node adapter does
// (its end-to-end test TestCRIRemovalKeepsNamesMadeDuringIt shows it):
// CRI's RemoveImage first removes every name CRI knows; a name a pull
// makes during that call stays, and the removal says the names changed;
// the names the re-check saw that CRI did not know go natively, once the
// node has read the names left (when it cannot, nothing more goes).
func (n *tableNode) RemoveImage(_ context.Context, _, digest string, names []gc.ImageName) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	img := n.images[digest]
	img.asked = names
	if img.removeErr != nil {
		return "", img.removeErr
	}
	via := "native"
	if len(img.criNames) > 0 {
		via = "cri"
		img.names = slices.DeleteFunc(img.names, func(name string) bool { return slices.Contains(img.criNames, name) })
		for _, name := range img.madeDuring {
			img.names = append(img.names, name)
			if img.born == nil {
				img.born = map[string]time.Time{}
			}
			img.born[name] = img.madeAt
		}
		if img.rereadErr != nil {
			return via, img.rereadErr
		}
	}
	img.names = slices.DeleteFunc(img.names, func(name string) bool {
		return slices.ContainsFunc(names, func(a gc.ImageName) bool { return a.Name == name && a.Created.Equal(img.born[name]) })
	})
	if len(img.names) > 0 {
		return via, fmt.Errorf("%w: %s made during the removal, kept", gc.ErrImageChanged, strings.Join(img.names, ", "))
	}
	n.removed = append(n.removed, digest)
	n.disk.free(img.frees)
	return via, nil
}

// Gone is the delete transaction's check, by the intent's identity (as
// node.Runtime.Gone): an image is gone once none of the names its delete
// was about is there with its record.
func (n *tableNode) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	img := n.images[in.Subject]
	if img == nil {
		return true, nil
	}
	if img.goneErr != nil {
		return false, img.goneErr
	}
	for _, name := range img.names {
		if in.Identity.NameSurvives(name, img.born[name]) {
			return false, nil
		}
	}
	return true, nil
}

// left is what names the image digest has on the node now, sorted.
func (n *tableNode) left(digest string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if img := n.images[digest]; img != nil {
		return slices.Sorted(slices.Values(img.names))
	}
	return nil
}

// tableDisk is statfs of the image filesystem (err: it fails).
type tableDisk struct {
	mu                  sync.Mutex
	capacity, available uint64
	err                 error
}

func (d *tableDisk) Disk() (gc.DiskStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return gc.DiskStats{CapacityBytes: d.capacity, AvailableBytes: d.available}, d.err
}

func (d *tableDisk) free(n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.available = min(d.available+n, d.capacity)
}

// tableJournal is a deletion.Journal in memory.
type tableJournal struct {
	mu  sync.Mutex
	seq uint64
}

func (j *tableJournal) Intend(ns string, a schema.Action, id *deletion.Identity) (deletion.Intent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	d, err := json.Marshal(a.Data)
	return deletion.Intent{Seq: j.seq, Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key, Data: d, Identity: id}, err
}
func (j *tableJournal) Complete(deletion.Intent, any) error { return nil }
func (j *tableJournal) Abandon(deletion.Intent) error       { return nil }
func (j *tableJournal) Pending() ([]deletion.Intent, error) { return nil, nil }
func (j *tableJournal) Publish(schema.Action) error         { return nil }
func newTableDeletes(t *testing.T, c deletion.Checker) *deletion.Manager {
	t.Helper()
	return newLockedTableDeletes(t, c, nil)
}

// newLockedTableDeletes is newTableDeletes whose deletes need lock (nil:
// none).
func newLockedTableDeletes(t *testing.T, c deletion.Checker, lock deletion.Lock) *deletion.Manager {
	t.Helper()
	m, err := deletion.New(deletion.Deps{Journal: &tableJournal{}, Checker: c, Lock: lock}, deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// imageWorld is a node for an image row: the events that built the
// projection (Synced among them or not), the node adapter's images, the
// disk, the policy, the fleet keep list and the time.
type imageWorld struct {
	events []events.Event
	images map[string]*tableImage
	disk   *tableDisk
	policy gc.ImagePolicy
	keep   keepReader    // nil: a known, empty fleet keep list
	wait   time.Duration // --keep-list-wait
	now    time.Time
	// lock is containerd's agent lock as the deletes see it (nil: none).
	lock deletion.Lock
	// node is the node adapter of the last pass.
	node *tableNode
}

// newImageWorld is a node at 90% usage (100 MiB, 10 free) whose images
// (digest: name) were first seen an hour before tableNow, unused; the
// listing is synced; policy: high 85, low 0, minimum age 2m.
func newImageWorld(images map[string]string) *imageWorld {
	w := &imageWorld{images: map[string]*tableImage{}, disk: &tableDisk{capacity: 100 * mib, available: 10 * mib},
		policy: gc.ImagePolicy{HighThresholdPercent: 85, MinAge: 2 * time.Minute}, wait: DefaultKeepListWait, now: tableNow}
	for _, d := range slices.Sorted(maps.Keys(images)) {
		w.events = append(w.events, events.ImageUpserted{At: tableNow.Add(-time.Hour), Name: images[d], Digest: d, Size: 8 * mib,
			ConfigDigest: "sha256:cfg-" + d[len("sha256:"):], ChainID: "sha256:chain-" + d[len("sha256:"):]})
		w.images[d] = &tableImage{names: []string{images[d]}, frees: 8 * mib}
	}
	w.events = append(w.events, events.Synced{At: tableNow.Add(-time.Minute)})
	return w
}

// outcome says what one image GC pass did to each image (by digest):
// "removed", or "kept: <reason>" (the executor's skip reason, else the
// plan's).
func (w *imageWorld) pass(t *testing.T) map[string]string {
	t.Helper()
	live, err := projection.NewLive(projection.LiveOptions{Now: func() time.Time { return w.now }})
	if err != nil {
		t.Fatal(err)
	}
	live.Apply(w.events...)
	n := &tableNode{images: w.images, disk: w.disk}
	w.node = n
	keep := w.keep
	if keep == nil {
		keep = knownFleetKeep(w.now)
	}
	policy := w.policy
	policy.FleetKeepWait = w.wait
	g, err := gc.NewImageGC(gc.ImageGCDeps{Projection: live, Runtime: n, Disk: w.disk, Deletes: newLockedTableDeletes(t, n, w.lock), FleetKeep: keep},
		gc.ImageGCOptions{Policy: policy, Clock: clock.System(func() time.Time { return w.now }), Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	before, derr := w.disk.Disk()
	if derr != nil {
		before = gc.DiskStats{} // as the pass plans: no measurement
	}
	p := g.Pass(context.Background(), "table")
	out := map[string]string{}
	var plan gc.ImagePlan
	policy = g.Policy()
	live.ViewAll(func(s []*projection.State) { plan = gc.PlanImages(s, before, policy, w.now) })
	for _, it := range plan.Keep {
		out[it.Digest] = "kept: " + string(it.Reason)
	}
	for _, it := range plan.Delete {
		out[it.Digest] = "planned: " + string(it.Reason)
	}
	for _, o := range p.Skipped {
		out[o.Digest] = "kept: " + string(o.Reason)
	}
	for _, o := range p.Removed {
		out[o.Digest] = "removed"
	}
	return out
}

// tableContainers is the node adapter for container rows: every CRI
// container and sandbox is dead, and removed when asked.
type tableContainers struct {
	mu      sync.Mutex
	removed []string
}

// ContainerCreated: the table's containers all have one creation time.
func (c *tableContainers) ContainerCreated(context.Context, string, string) (time.Time, error) {
	return time.Unix(1, 0), nil
}
func (c *tableContainers) NativeLiveness(context.Context, string, string) (gc.Liveness, error) {
	return gc.LiveUnknown, nil
}
func (c *tableContainers) DeleteNative(context.Context, string, string) (gc.OwnerCleanup, error) {
	return gc.OwnerCleanup{}, errors.New("no native container in this world")
}
func (c *tableContainers) CRIContainerLiveness(_ context.Context, id string) (gc.Liveness, error) {
	return c.live(id), nil
}
func (c *tableContainers) CRISandboxLiveness(_ context.Context, id string) (gc.Liveness, error) {
	return c.live(id), nil
}
func (c *tableContainers) CRIContainerLogPath(_ context.Context, id string) (string, error) {
	if c.live(id) == gc.LiveGone {
		return "", gc.ErrContainerGone
	}
	return "", nil // no log: the world has no log dir
}
func (c *tableContainers) RemoveCRIContainer(_ context.Context, id string) error {
	c.remove(id)
	return nil
}
func (c *tableContainers) RemoveCRISandbox(_ context.Context, id string) error {
	c.remove(id)
	return nil
}
func (c *tableContainers) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	return c.live(in.Subject) == gc.LiveGone, nil
}
func (c *tableContainers) live(id string) gc.Liveness {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Contains(c.removed, id) {
		return gc.LiveGone
	}
	return gc.LiveDead
}
func (c *tableContainers) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed = append(c.removed, id)
}

// podWorld is a stopped pod (uid u-web, default/web): its sandbox and one
// dead container, on a node with --prune-containers=all, one dead
// container kept per container, --pod-log-grace 1m, and the pod log dir
// podLogDir (read by the agent's own code).
type podWorld struct {
	podLogDir string
	clock     *clock.Fake
	gc        *gc.ContainerGC
	rt        *tableContainers
}

const podDirName = "default_web_u-web"

func newPodWorld(t *testing.T, podLogDir string) *podWorld {
	t.Helper()
	w := &podWorld{podLogDir: podLogDir, clock: clock.NewFake(tableNow), rt: &tableContainers{}}
	live, err := projection.NewLive(projection.LiveOptions{Now: w.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	at := tableNow.Add(-time.Hour)
	pod := func(id, kind string) events.ContainerUpserted {
		e := events.ContainerUpserted{At: at, ID: id, Image: "registry.k8s.io/pause:3.10", CRIKind: kind, PodUID: "u-web",
			PodName: "web", PodNamespace: "default", Created: at}
		if kind == projection.KindContainer {
			e.Image, e.ContainerName, e.SandboxID = "example.test/app:1", "app", "sb-web"
		}
		return e
	}
	live.Apply(
		pod("sb-web", projection.KindSandbox), events.TaskStarted{At: at, ContainerID: "sb-web", Pid: 1},
		pod("c-app", projection.KindContainer), events.TaskStarted{At: at, ContainerID: "c-app", Pid: 2},
		events.TaskExited{At: at.Add(time.Minute), ContainerID: "c-app", ExitStatus: 1, ExitedAt: at.Add(time.Minute)},
		events.TaskExited{At: at.Add(time.Minute), ContainerID: "sb-web", ExitedAt: at.Add(time.Minute)},
		events.Synced{At: at.Add(2 * time.Minute)},
	)
	w.gc, err = gc.NewContainerGC(gc.ContainerGCDeps{State: live, Changes: live.Subscribe(), Runtime: w.rt, Deletes: newTableDeletes(t, w.rt),
		PodLogDir: podSignFor(podLogDir)}, gc.ContainerGCOptions{
		Policy: gc.ContainerPolicy{Prune: gc.PruneAll, MaxPerEvictUnit: 1, MaxContainers: -1, PodGrace: time.Minute},
		Clock:  w.clock, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// pass runs one container GC pass.
func (w *podWorld) pass(t *testing.T) {
	t.Helper()
	if _, err := w.gc.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// passes runs a pass, lets the grace pass, and runs another: what the
// container GC does to the pod over its grace.
func (w *podWorld) passes(t *testing.T) []string {
	t.Helper()
	w.pass(t)
	w.clock.Step(2 * time.Minute)
	w.pass(t)
	w.rt.mu.Lock()
	defer w.rt.mu.Unlock()
	return slices.Sorted(slices.Values(w.rt.removed))
}

// mkdir makes a directory or fails t.
func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}
