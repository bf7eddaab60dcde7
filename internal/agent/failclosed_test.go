package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
)

// The inputs a delete decision reads (invariant 7, docs/architecture.md
// "Fail closed"), and the states each can be in.
var (
	failClosedInputs = []string{"containerd listing", "CRI listing", "snapshotters", "leases", "fleet keep list",
		"cluster keep list", "--keep-image", "pod log dir", "clock", "disk measurement",
		"CRI removal names", "intent identity", "taskless CRI container", "agent lock"}
	failClosedStates = []string{"known", "unknown", "stale"}
)

// failClosedRow is one input in one state and what the delete decision
// must do then. run builds the world and runs the agent's real decision
// (planner, executor, delete transaction; the node adapter faked) and
// returns what became of the object the row is about.
type failClosedRow struct {
	input, state string
	world        string // the node, in a sentence
	issue        string // the item of issue 34 the row is from ("" when none)
	na           string // why the combination does not exist (run is nil)
	run          func(t *testing.T) string
	want         string
	// awaits names the branch that makes the row hold (it fails until
	// that merges): the row must still fail, and fails the table once it
	// holds, so that whoever merges removes the mark.
	awaits string
}

const target = "sha256:aaaa" // the image an image row is about

// imageRow runs an image world (newImageWorld with the target image named
// name, changed by setup) and returns what became of the target.
func imageRow(name string, setup func(t *testing.T, w *imageWorld)) func(t *testing.T) string {
	return func(t *testing.T) string {
		w := newImageWorld(map[string]string{target: name})
		if setup != nil {
			setup(t, w)
		}
		return w.pass(t)[target]
	}
}

// containerUser is a CRI container of the image, as the projection knows
// it (by CRI's image id, or by the chain its rootfs descends from).
func containerUser(id string, imageID, rootChain string) events.Event {
	return events.ContainerUpserted{At: tableNow.Add(-time.Hour), ID: id, Image: "example.test/a:1", CRIKind: "container",
		PodUID: "u-1", PodName: "p", PodNamespace: "default", ContainerName: "c", SandboxID: "sb-1", Created: tableNow.Add(-time.Hour),
		ImageID: imageID, RootChain: rootChain}
}

// failClosedRows is the decision table.
func failClosedRows() []failClosedRow {
	unsynced := func(_ *testing.T, w *imageWorld) { w.events = w.events[:len(w.events)-1] } // no Synced: never listed
	holders := func(h ...gc.Holder) func(*testing.T, *imageWorld) {
		return func(_ *testing.T, w *imageWorld) { w.images[target].holders = h }
	}
	holdersErr := func(err error) func(*testing.T, *imageWorld) {
		return func(_ *testing.T, w *imageWorld) { w.images[target].holdersErr = err }
	}
	app := "registry.example/app:7"
	return []failClosedRow{
		// containerd's listing: the projection.
		{input: "containerd listing", state: "known", world: "listed and synced; the image unused, old, the disk over the high threshold",
			run: imageRow("example.test/a:1", nil), want: "removed"},
		{input: "containerd listing", state: "unknown", world: "containerd not listed yet (the projection restored, not synced)",
			run: imageRow("example.test/a:1", unsynced), want: "kept: not-synced"},
		{input: "containerd listing", state: "stale", world: "a name added to the image while events were missed: the projection does not know it",
			run: imageRow("example.test/a:1", func(_ *testing.T, w *imageWorld) {
				w.images[target].names = append(w.images[target].names, "example.test/a:2")
			}), want: "kept: changed"},
		// CRI's listing.
		{input: "CRI listing", state: "known", world: "a CRI container runs the image (CRI's image id is its config digest)",
			run: imageRow("example.test/a:1", func(_ *testing.T, w *imageWorld) {
				w.events = append(w.events, containerUser("c-1", "sha256:cfg-aaaa", ""))
			}), want: "kept: in-use-by-image-id"},
		{input: "CRI listing", state: "unknown", world: "CRI does not answer the re-check before the delete",
			run: imageRow("example.test/a:1", holdersErr(errors.New("cri list containers: Unavailable"))), want: "kept: error"},
		{input: "CRI listing", state: "stale", world: "a CRI container of the image created while events were missed",
			run: imageRow("example.test/a:1", holders(gc.Holder{Kind: gc.HolderCRI, ID: "c-new"})), want: "kept: in-use"},
		// The snapshotters.
		{input: "snapshotters", state: "known", world: "a container's rootfs descends from the image's top layer",
			run: imageRow("example.test/a:1", func(_ *testing.T, w *imageWorld) {
				w.events = append(w.events, containerUser("c-1", "", "sha256:chain-aaaa"))
			}), want: "kept: in-use-by-snapshot"},
		{input: "snapshotters", state: "unknown", world: "a snapshotter cannot be walked at the re-check",
			run: imageRow("example.test/a:1", holdersErr(errors.New("walk snapshotter native: Unavailable"))), want: "kept: error"},
		{input: "snapshotters", state: "stale", world: "a view of the image made on another snapshotter since the listing",
			run: imageRow("example.test/a:1", holders(gc.Holder{Kind: gc.HolderSnapshot, ID: "native/view-1"})), want: "kept: in-use"},
		// Leases: read only at the re-check, after the intent is durable.
		{input: "leases", state: "known", world: "a pull's lease holds the image's content",
			run: imageRow("example.test/a:1", holders(gc.Holder{Kind: gc.HolderLease, ID: "pull-1"})), want: "kept: in-flight-pull"},
		{input: "leases", state: "unknown", world: "the leases cannot be listed at the re-check",
			run: imageRow("example.test/a:1", holdersErr(errors.New("list leases: Unavailable"))), want: "kept: error"},
		{input: "leases", state: "stale", na: "read afresh at each delete's re-check, after its intent is durable: no older reading is used"},
		// The fleet keep list (it names registry.example/app:*).
		{input: "fleet keep list", state: "known", world: "NATS confirmed the list just now",
			run:  imageRow(app, func(_ *testing.T, w *imageWorld) { w.keep = knownFleetKeep(w.now, "registry.example/app:*") }),
			want: "kept: keep-pattern"},
		{input: "fleet keep list", state: "unknown", issue: "34.1", world: "never read: none saved, NATS not answering since the agent started a minute ago (--keep-list-wait 5m)",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				w.keep = fleetKeepFor(t.TempDir(), w.wait, func() time.Time { return w.now })
				w.now = w.now.Add(time.Minute)
			}), want: "kept: keep-list-unread"},
		{input: "fleet keep list", state: "unknown", world: "never read, and --keep-list-wait has passed: GC goes on with --keep-image only",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				w.keep = fleetKeepFor(t.TempDir(), w.wait, func() time.Time { return w.now })
				w.now = w.now.Add(w.wait)
			}), want: "removed"},
		{input: "fleet keep list", state: "stale", world: "NATS away for an hour: the list saved in the state dir",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				dir := t.TempDir()
				saveFleetKeep(t, dir, w.now.Add(-time.Hour), "registry.example/app:*")
				w.keep = fleetKeepFor(dir, w.wait, func() time.Time { return w.now })
			}), want: "kept: keep-pattern"},
		// --keep-image.
		{input: "--keep-image", state: "known", issue: "34.9", world: "--keep-image registry.example/app:* and a digest-pinned image (its only name registry.example/app@sha256:...)",
			run: imageRow("registry.example/app@sha256:"+strings.Repeat("ab", 32), func(_ *testing.T, w *imageWorld) {
				w.policy.KeepPatterns = []string{"registry.example/app:*"}
			}), want: "kept: keep-pattern"},
		{input: "--keep-image", state: "unknown", na: "a flag, read once at start: an invalid pattern stops the start (exit 2)"},
		{input: "--keep-image", state: "stale", na: "a flag: it cannot change while the agent runs"},
		// The pod log dir: a stopped pod's newest sandbox and last dead
		// container, --prune-containers=all.
		{input: "pod log dir", state: "known", world: "the pod's log dir was seen, then removed (the kubelet deleted the pod); --pod-log-grace passed",
			run: func(t *testing.T) string {
				dir := t.TempDir()
				mkdir(t, filepath.Join(dir, podDirName))
				w := newPodWorld(t, dir)
				w.pass(t)
				if err := os.Remove(filepath.Join(dir, podDirName)); err != nil {
					t.Fatal(err)
				}
				return "removed: " + strings.Join(w.passes(t), ",")
			}, want: "removed: c-app,sb-web"},
		{input: "pod log dir", state: "unknown", issue: "34.2",
			world: "the pod's log dir never seen: --pod-log-dir exists but is empty (not the kubelet's), no pod running",
			run: func(t *testing.T) string {
				return "removed: " + strings.Join(newPodWorld(t, t.TempDir()).passes(t), ",")
			}, want: "removed: "},
		{input: "pod log dir", state: "stale", world: "the pod's log dir was seen, then --pod-log-dir itself went (unmounted)",
			run: func(t *testing.T) string {
				dir := filepath.Join(t.TempDir(), "pods")
				mkdir(t, filepath.Join(dir, podDirName))
				w := newPodWorld(t, dir)
				w.pass(t)
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				return "removed: " + strings.Join(w.passes(t), ",")
			}, want: "removed: "},
		// The clock: the agent's own (internal/clock), continued across restarts.
		{input: "clock", state: "known", world: "the agent's time continued from its saved mark; the image first seen an hour before",
			run: imageRow("example.test/a:1", func(t *testing.T, w *imageWorld) {
				file := filepath.Join(t.TempDir(), clock.File)
				if err := agentClock(0, file).Save(file); err != nil {
					t.Fatal(err)
				}
				w.now = agentClock(0, file).Now()
				rebase(w, w.now.Add(-time.Hour))
			}), want: "removed"},
		{input: "clock", state: "unknown", world: "no saved agent time and a wall clock never set (1970, no RTC): the journal first saw the image in 2026",
			run: imageRow("example.test/a:1", func(t *testing.T, w *imageWorld) {
				w.now = agentClock(-time.Since(time.Unix(0, 0)), filepath.Join(t.TempDir(), clock.File)).Now()
			}), want: "kept: too-young"},
		{input: "clock", state: "stale", world: "the wall clock stepped a day ahead while the agent was down; the image first seen a minute before the restart",
			run: imageRow("example.test/a:1", func(t *testing.T, w *imageWorld) {
				file := filepath.Join(t.TempDir(), clock.File)
				c := agentClock(0, file)
				if err := c.Save(file); err != nil {
					t.Fatal(err)
				}
				rebase(w, c.Now().Add(-time.Minute))
				w.now = agentClock(24*time.Hour, file).Now()
			}), want: "kept: too-young"},
		// The disk measurement.
		{input: "disk measurement", state: "known", world: "statfs: 90% used, high threshold 85",
			run: imageRow("example.test/a:1", nil), want: "removed"},
		{input: "disk measurement", state: "unknown", world: "statfs fails: threshold GC cannot run (max-age GC still does)",
			run:  imageRow("example.test/a:1", func(_ *testing.T, w *imageWorld) { w.disk.err = errors.New("statfs: input/output error") }),
			want: "kept: not-needed"},
		{input: "disk measurement", state: "stale", world: "an earlier delete in the pass failed and containerd cannot say what happened: the measurement predates it",
			run: func(t *testing.T) string {
				w := newImageWorld(map[string]string{"sha256:0000": "example.test/first:1", target: "example.test/a:1"})
				w.disk.available = 1 * mib // both needed
				w.images["sha256:0000"].removeErr = errors.New("context deadline exceeded")
				w.images["sha256:0000"].goneErr = errors.New("containerd: Unavailable")
				return w.pass(t)[target]
			}, want: "kept: unsettled"},
	}
}

// rebase moves every event of the world so that its images were first
// seen at first (the clock rows' worlds live on the agent's clock).
func rebase(w *imageWorld, first time.Time) {
	for i, ev := range w.events {
		switch e := ev.(type) {
		case events.ImageUpserted:
			e.At = first
			w.events[i] = e
		case events.Synced:
			e.At = first.Add(time.Second)
			w.events[i] = e
		}
	}
}

// TestFailClosedDecisionTable walks every input a delete decision reads
// in each of its states (known, unknown, stale) and asserts what the
// agent keeps: an input that is unknown or stale keeps whatever it could
// protect (invariant 7), and a known one lets go what nothing protects,
// so each row can fail. A combination that cannot occur is a row with the
// reason. Rows marked with an item of issue 34 failed on 7485972; a row
// marked awaits fails until the branch it names merges.
func TestFailClosedDecisionTable(t *testing.T) {
	rows := slices.Concat(failClosedRows(), nodeRows(), clusterRows())
	for _, in := range failClosedInputs {
		for _, st := range failClosedStates {
			if !slices.ContainsFunc(rows, func(r failClosedRow) bool { return r.input == in && r.state == st }) {
				t.Errorf("no row for %s %s", in, st)
			}
		}
	}
	for _, r := range rows {
		if !slices.Contains(failClosedInputs, r.input) || !slices.Contains(failClosedStates, r.state) {
			t.Errorf("row %q %q: not an input and state of the table", r.input, r.state)
		}
		name := r.input + "/" + r.state
		if r.issue != "" {
			name += "/issue-" + r.issue
		}
		t.Run(name, func(t *testing.T) {
			if r.run == nil {
				if r.na == "" {
					t.Fatal("a row without a world says why the combination does not exist")
				}
				t.Logf("n/a: %s", r.na)
				return
			}
			got := r.run(t)
			switch {
			case r.awaits != "" && got == r.want:
				t.Errorf("%s: holds now (%q): remove its awaits mark (%s)", r.world, got, r.awaits)
			case r.awaits != "":
				t.Logf("AWAITS %s: %s\n got %q\nwant %q", r.awaits, r.world, got, r.want)
			case got != r.want:
				t.Errorf("%s\n got %q\nwant %q", r.world, got, r.want)
			}
			t.Logf("%s: %s", r.world, fmt.Sprint(got))
		})
	}
}
