package gc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
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

func (l *fakeLogs) RemoveContainerLogs(ref ContainerLogRef) (ContainerLogs, error) {
	l.refs = append(l.refs, ref)
	if err := l.fail; err != nil {
		l.fail = nil
		_ = l.rt.call("remove-logs", ref.ID+" !")
		return ContainerLogs{Path: ref.LogPath, Files: []string{ref.LogPath}}, err
	}
	_ = l.rt.call("remove-logs", ref.ID)
	return l.found(ref), nil
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
