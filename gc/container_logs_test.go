package gc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
)

// fakeLogs is a containerLogFiles that records its calls in the runtime's
// call log (so that the order of logs and container is seen) and finds
// one log file per container.
type fakeLogs struct {
	rt   *fakeContainerRuntime
	refs []ContainerLogRef
	fail error // returned by RemoveContainerLogs, once
}

var _ containerLogFiles = (*fakeLogs)(nil)

func (l *fakeLogs) found(ref ContainerLogRef) ContainerLogs {
	return ContainerLogs{Path: ref.LogPath, Files: []string{ref.LogPath, ref.LogPath + ".20260101-000000.gz"},
		Link: "/var/log/containers/" + ref.ID + ".log", Bytes: 8192}
}

func (l *fakeLogs) FindContainerLogs(ref ContainerLogRef) (ContainerLogs, error) {
	_ = l.rt.call("find-logs", ref.ID)
	l.refs = append(l.refs, ref)
	return l.found(ref), nil
}

func (l *fakeLogs) RemoveContainerLogs(ref ContainerLogRef) (ContainerLogs, []LogRemoval, error) {
	l.refs = append(l.refs, ref)
	if err := l.fail; err != nil {
		l.fail = nil
		_ = l.rt.call("remove-logs", ref.ID+" !")
		return ContainerLogs{Path: ref.LogPath, Files: []string{ref.LogPath}}, fakeLogPaths(ref, false), err
	}
	_ = l.rt.call("remove-logs", ref.ID)
	return l.found(ref), fakeLogPaths(ref, true), nil
}

// fakeLogPaths are found's paths one by one: the log file, and with all
// its rotated file and the link.
func fakeLogPaths(ref ContainerLogRef, all bool) []LogRemoval {
	rel := strings.TrimPrefix(ref.LogPath, "/var/log/pods/")
	out := []LogRemoval{{Kind: schema.LogKindFile, Dir: "/var/log/pods", Name: rel, Bytes: 4096, Entries: 1}}
	if all {
		out = append(out, LogRemoval{Kind: schema.LogKindFile, Dir: "/var/log/pods", Name: rel + ".20260101-000000.gz", Bytes: 4096, Entries: 1},
			LogRemoval{Kind: "symlink", Dir: "/var/log/containers", Name: ref.ID + ".log", Entries: 1})
	}
	return out
}

// TestContainerExecutorRemovesLogsWithTheContainer (issue 34, item 5): a
// CRI container's removal removes its log files and legacy link first, as
// the kubelet's does, found by the log path CRI gives, inside the same
// delete transaction, and its container.removed event says what went. A
// log that cannot go keeps the container (its intent abandoned) for a
// retry. A dry run finds the files, removes nothing, and says so; plain
// containers and sandboxes have no such logs.
func TestContainerExecutorRemovesLogsWithTheContainer(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	ck := clock.System(func() time.Time { return at(time.Minute) })
	t.Run("removed", func(t *testing.T) {
		f := newFakeContainerRuntime()
		logs := &fakeLogs{rt: f}
		pub := &fakePublisher{}
		deletes, j := testDeletes(t, pub, f)
		e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: deletes, Publisher: pub, Logs: logs},
			ContainerExecutorOptions{Parallelism: 1, Clock: ck})
		if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
			t.Fatal(err)
		}
		want := []string{"native-liveness n-dead", "delete-native n-dead",
			"cri-liveness app-1", "cri-log-path app-1", "remove-logs app-1", "cri-remove app-1",
			"cri-liveness app-2", "cri-log-path app-2", "remove-logs app-2", "cri-remove app-2"}
		if got := f.Calls(); !slices.Equal(got, want) {
			t.Errorf("calls\n %q\nwant\n %q", got, want)
		}
		if got, want := j.Log(), []string{"intend n-dead", "complete n-dead", "intend app-1", "complete app-1", "intend app-2", "complete app-2"}; !slices.Equal(got, want) {
			t.Errorf("journal %q, want %q", got, want)
		}
		for _, ref := range logs.refs {
			if ref.PodUID != "u1" || ref.PodName != "pod-u1" || ref.PodNamespace != "default" || ref.ContainerName != "app" ||
				ref.LogPath != "/var/log/pods/default_pod_uid/"+ref.ID+"/0.log" {
				t.Errorf("log ref %+v: want the pod's labels and CRI's log path", ref)
			}
		}
		for _, a := range pub.Actions() {
			r := a.Data.(ContainerRemoval)
			switch {
			case r.Kind != ContainerKindContainer && r.Logs != nil:
				t.Errorf("%s %s: logs %+v, want none", r.Kind, r.ID, r.Logs)
			case r.Kind == ContainerKindContainer && (r.Logs == nil || len(r.Logs.Files) != 2 || r.Logs.Link == "" || r.Logs.Bytes != 8192):
				t.Errorf("%s: logs %+v, want the two files, the link and their bytes", r.ID, r.Logs)
			}
		}
	})
	t.Run("a log that cannot go keeps the container", func(t *testing.T) {
		f := newFakeContainerRuntime()
		logs := &fakeLogs{rt: f, fail: errors.New("unlink 0.log: operation not permitted")}
		deletes, j := testDeletes(t, nil, f)
		e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: deletes, Logs: logs}, ContainerExecutorOptions{Parallelism: 1, Clock: ck})
		res, err := e.Apply(context.Background(), plan, allPolicy)
		if err == nil || !strings.Contains(err.Error(), "remove the log of container app-1: unlink 0.log") {
			t.Errorf("error %v, want the log's", err)
		}
		if got, want := f.Deletes(), []string{"delete-native n-dead", "cri-remove app-2"}; !slices.Equal(got, want) {
			t.Errorf("deletes %q, want %q: app-1 stays", got, want)
		}
		if !slices.Contains(j.Log(), "abandon app-1") {
			t.Errorf("journal %q: app-1's intent not abandoned", j.Log())
		}
		for _, r := range res {
			if r.ID == "app-1" && r.Outcome != ContainerFailed {
				t.Errorf("app-1 %s, want failed (retried)", r.Outcome)
			}
		}
	})
	t.Run("dry run", func(t *testing.T) {
		f := newFakeContainerRuntime()
		logs := &fakeLogs{rt: f}
		pub := &fakePublisher{}
		e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Publisher: pub, Logs: logs}, ContainerExecutorOptions{DryRun: true, Parallelism: 1, Clock: ck})
		if _, err := e.Apply(context.Background(), plan, allPolicy); err != nil {
			t.Fatal(err)
		}
		if d := f.Deletes(); len(d) != 0 {
			t.Errorf("dry run deleted %v", d)
		}
		for _, c := range f.Calls() {
			if strings.HasPrefix(c, "remove-logs") {
				t.Errorf("dry run called %s", c)
			}
		}
		n := 0
		for _, a := range pub.Actions() {
			if s := a.Data.(ContainerSkip); s.Kind == ContainerKindContainer {
				n++
				if s.Logs == nil || len(s.Logs.Files) != 2 || s.Logs.Link == "" {
					t.Errorf("dry run of %s: logs %+v, want what would go", s.ID, s.Logs)
				}
			}
		}
		if n != 2 {
			t.Errorf("%d dry-run skips of CRI containers, want 2", n)
		}
	})
}

// TestLogsRemovedWithAContainerThatStaysAreReported (issue 40, item 7):
// the log files and link removed before a CRI container's removal are
// reported by log.removed events, one per path, whenever the
// container's own container.removed does not list them: its removal
// failed and containerd says it did not happen, its owner removed it
// first, its outcome is not known yet (a container.removed settled later
// carries the intent's data, which names no file), or a log file could
// not go (what went is reported). Each event names the container, its
// reason and why it stayed; the other container's removal lists its
// files in its own event, and no path is reported twice. On d7dd547 no
// event reported them.
func TestLogsRemovedWithAContainerThatStaysAreReported(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	ck := clock.System(func() time.Time { return at(time.Minute) })
	for _, tc := range []struct {
		name   string
		inject func(f *fakeContainerRuntime, l *fakeLogs)
		paths  int    // log.removed events of app-1
		why    string // in their error
		failed bool   // Apply returns an error
	}{
		{"removal failed, not happened", func(f *fakeContainerRuntime, _ *fakeLogs) {
			f.InjectError("cri-remove", "app-1", errors.New("rpc error: code = Unknown desc = failed to remove"))
		}, 3, "the container's removal failed: rpc error", true},
		{"its owner removed it first", func(f *fakeContainerRuntime, _ *fakeLogs) {
			f.InjectError("cri-remove", "app-1", ErrOwnerWon)
		}, 3, "its owner removed the container first", false},
		{"outcome unknown", func(f *fakeContainerRuntime, _ *fakeLogs) {
			f.InjectError("cri-remove", "app-1", errors.New("rpc error: code = DeadlineExceeded"))
			f.InjectError("gone", "app-1", errors.New("containerd not answering"))
		}, 3, "its outcome not known yet", true},
		{"a log file could not go", func(_ *fakeContainerRuntime, l *fakeLogs) {
			l.fail = errors.New("unlink 0.log.1: operation not permitted")
		}, 1, "the log not removed in full, the container stays: unlink", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeContainerRuntime()
			logs := &fakeLogs{rt: f}
			tc.inject(f, logs)
			pub := &fakePublisher{}
			deletes, _ := testDeletes(t, pub, f)
			e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: deletes, Publisher: pub, Logs: logs},
				ContainerExecutorOptions{Parallelism: 1, Clock: ck})
			_, err := e.Apply(context.Background(), plan, allPolicy)
			if (err != nil) != tc.failed {
				t.Errorf("error %v, want one: %v", err, tc.failed)
			}
			subjects := map[string]int{}
			var alone []LogRemoval
			for _, a := range pub.Actions() {
				switch d := a.Data.(type) {
				case LogRemoval:
					if a.Kind != "log" || a.Action != ActionRemoved || a.Key == "" {
						t.Errorf("action %s.%s key %q, want log.removed with a key", a.Kind, a.Action, a.Key)
					}
					alone = append(alone, d)
					subjects[a.Subject]++
				case ContainerRemoval:
					if d.ID == "app-1" && (d.Logs == nil || len(d.Logs.Files) != 0) && tc.name != "outcome unknown" {
						t.Errorf("container.removed of app-1 (%+v), which stayed", d)
					}
					if d.Logs != nil {
						for _, p := range d.Logs.Files {
							subjects[p]++
						}
					}
				}
			}
			if len(alone) != tc.paths {
				t.Fatalf("%d log.removed events (%+v), want %d: one per path app-1's removal removed", len(alone), alone, tc.paths)
			}
			for _, r := range alone {
				if r.Container != "app-1" || r.UID != "u1" || r.Reason != ReasonPerUnitCap || r.Namespace != plan.Remove[0].Namespace ||
					!strings.Contains(r.Error, tc.why) || r.Dir == "" || r.Name == "" || r.Entries != 1 || !r.At.Equal(at(time.Minute)) {
					t.Errorf("log.removed %+v: want app-1's, reason per-unit-cap, error %q", r, tc.why)
				}
			}
			for p, n := range subjects {
				if n > 1 {
					t.Errorf("%s reported %d times", p, n)
				}
			}
		})
	}
}

// TestShowContainerLogs: a plan shown to an operator names, for each CRI
// container it removes, the log files and link that go with it.
func TestShowContainerLogs(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	f := newFakeContainerRuntime()
	f.Set("app-2", LiveGone)
	ShowContainerLogs(context.Background(), &plan, f, &fakeLogs{rt: f})
	for _, it := range plan.Remove {
		switch {
		case it.ID == "app-1" && (it.Logs == nil || len(it.Logs.Files) != 2):
			t.Errorf("app-1: logs %+v, want two files", it.Logs)
		case it.ID == "app-2" && (it.Logs == nil || !strings.Contains(it.Logs.Kept, "not known")):
			t.Errorf("app-2 (gone from CRI): logs %+v, want why none", it.Logs)
		case it.CRIKind != ContainerKindContainer && it.Logs != nil:
			t.Errorf("%s: logs %+v, want none", it.ID, it.Logs)
		}
	}
	if d := f.Deletes(); len(d) != 0 {
		t.Errorf("showing deleted %v", d)
	}
}
