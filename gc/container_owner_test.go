package gc

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// ownerRuntime is fakeContainerRuntime whose native containers may have an
// owner keeping state outside containerd (nerdctl): kept says which the
// re-check keeps and why, cleaned what DeleteNative cleans of each.
type ownerRuntime struct {
	*fakeContainerRuntime
	kept    map[string]*Kept
	cleaned map[string]OwnerCleanup
}

var _ containerRuntime = (*ownerRuntime)(nil)

func (f *ownerRuntime) NativeLiveness(ctx context.Context, ns, id string) (Liveness, error) {
	l, err := f.fakeContainerRuntime.NativeLiveness(ctx, ns, id)
	if k := f.kept[id]; k != nil && err == nil && l == LiveDead {
		return "", k
	}
	return l, err
}

func (f *ownerRuntime) DeleteNative(ctx context.Context, ns, id string) (OwnerCleanup, error) {
	if _, err := f.fakeContainerRuntime.DeleteNative(ctx, ns, id); err != nil {
		return OwnerCleanup{}, err
	}
	return f.cleaned[id], nil
}

// removalData returns the data of each container.removed published, by
// subject, as JSON.
func removalData(t *testing.T, pub *fakePublisher) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range pub.Actions() {
		if a.Kind == "container" && a.Action == ActionRemoved {
			b, err := json.Marshal(a.Data)
			if err != nil {
				t.Fatal(err)
			}
			out[a.Subject] = string(b)
		}
	}
	return out
}

// TestContainerExecutorOwnerCleanup: what DeleteNative cleaned of a
// nerdctl container's state goes into its removal event (ownerState); a
// container without an owner has none; a cleanup that failed after the
// delete is a removal, not a failure, logged as a warning with its error
// in the event.
func TestContainerExecutorOwnerCleanup(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	tests := []struct {
		name      string
		cleaned   OwnerCleanup
		wantState string // the ownerState of n-dead's event, "" for none
		wantWarn  bool
	}{{
		name: "nerdctl state cleaned",
		cleaned: OwnerCleanup{Owner: "nerdctl", Bytes: 12288,
			Removed: []string{"/nd/1935db59/names/default/web", "/nd/1935db59/etchosts/default/n-dead", "/nd/1935db59/containers/default/n-dead"}},
		wantState: `{"owner":"nerdctl","removed":["/nd/1935db59/names/default/web","/nd/1935db59/etchosts/default/n-dead","/nd/1935db59/containers/default/n-dead"],"bytes":12288}`,
	}, {
		name:      "name lock held by another container",
		cleaned:   OwnerCleanup{Owner: "nerdctl", Removed: []string{"/nd/1935db59/containers/default/n-dead"}, Bytes: 4096, NameHeldBy: "other"},
		wantState: `{"owner":"nerdctl","removed":["/nd/1935db59/containers/default/n-dead"],"bytes":4096,"nameHeldBy":"other"}`,
	}, {
		name:      "cleanup failed after the delete",
		cleaned:   OwnerCleanup{Owner: "nerdctl", Removed: []string{"/nd/1935db59/names/default/web"}, Error: "lock \"/nd/1935db59/etchosts\": context deadline exceeded"},
		wantState: `{"owner":"nerdctl","removed":["/nd/1935db59/names/default/web"],"error":"lock \"/nd/1935db59/etchosts\": context deadline exceeded"}`,
		wantWarn:  true,
	}, {
		name: "not made by nerdctl",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &ownerRuntime{fakeContainerRuntime: newFakeContainerRuntime(), cleaned: map[string]OwnerCleanup{"n-dead": tc.cleaned}}
			pub := &fakePublisher{}
			var logs bytes.Buffer
			e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, pub, f), Publisher: pub}, ContainerExecutorOptions{Parallelism: 1, Log: zerolog.New(&logs), Clock: clock.System(func() time.Time { return at(time.Minute) })})
			res, err := e.Apply(context.Background(), plan, allPolicy)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if r.Outcome != ContainerRemoved {
					t.Errorf("%s: %s (%s), want removed", r.ID, r.Outcome, r.Error)
				}
			}
			data := removalData(t, pub)
			for _, id := range []string{"n-dead", "app-1", "app-2"} {
				d, ok := data[id]
				if !ok {
					t.Fatalf("no container.removed for %s", id)
				}
				var got struct {
					OwnerState json.RawMessage `json:"ownerState"`
				}
				if err := json.Unmarshal([]byte(d), &got); err != nil {
					t.Fatal(err)
				}
				want := ""
				if id == "n-dead" {
					want = tc.wantState
				}
				if string(got.OwnerState) != want {
					t.Errorf("%s: ownerState %s, want %q", id, got.OwnerState, want)
				}
			}
			warned := strings.Contains(logs.String(), `"level":"warn"`) &&
				strings.Contains(logs.String(), "the container is removed but not all of its owner's state")
			if warned != tc.wantWarn {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.wantWarn, logs.String())
			}
		})
	}
}

// TestContainerExecutorKeptForOwnerState: a dead container the re-check
// keeps with a *Kept error is kept, not a failed re-check: never deleted,
// counted under its liveness, its detail in the result, and logged once
// over passes.
func TestContainerExecutorKeptForOwnerState(t *testing.T) {
	plan := PlanContainers(nodeState(), allPolicy, at(time.Minute))
	why := `nerdctl state of "k8s.io/n-dead": state dir "/elsewhere/x" is not under the data root "/var/lib/nerdctl": does not fit nerdctl's layout`
	f := &ownerRuntime{fakeContainerRuntime: newFakeContainerRuntime(), kept: map[string]*Kept{"n-dead": {Live: LiveOwnerState, Why: why}}}
	pub := &fakePublisher{}
	reg := prometheus.NewRegistry()
	m, err := NewContainerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	e := mustExecutor(t, ContainerExecutorDeps{Runtime: f, Deletes: testDeletes1(t, pub, f), Publisher: pub}, ContainerExecutorOptions{Metrics: m, Parallelism: 1, Log: zerolog.New(&logs), Clock: clock.System(func() time.Time { return at(time.Minute) })})
	for pass := range 3 {
		res, err := e.Apply(context.Background(), plan, allPolicy)
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		for _, r := range res {
			if r.ID != "n-dead" {
				continue
			}
			if r.Outcome != ContainerKept || r.Live != LiveOwnerState || r.Detail != why || r.Error != "" {
				t.Errorf("pass %d: n-dead %s, liveness %q, detail %q, error %q; want kept, owner-state, the reason, no error",
					pass, r.Outcome, r.Live, r.Detail, r.Error)
			}
		}
	}
	if slices.Contains(f.Deletes(), "delete-native n-dead") {
		t.Errorf("n-dead was deleted: %v", f.Deletes())
	}
	if _, ok := removalData(t, pub)["n-dead"]; ok {
		t.Error("a removal event for the kept container")
	}
	if n := testutil.ToFloat64(m.kept.WithLabelValues(string(LiveOwnerState))); n != 3 {
		t.Errorf("kept{liveness=owner-state} = %v, want 3", n)
	}
	if n := testutil.ToFloat64(m.errors.WithLabelValues("recheck")); n != 0 {
		t.Errorf("recheck errors = %v, want 0", n)
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"kept on re-check"`) && strings.Contains(l, `"container":"n-dead"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d 'kept on re-check' lines for n-dead over 3 passes, want 1:\n%s", len(lines), logs.String())
	}
	var line struct {
		Liveness string `json:"liveness"`
		Detail   string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil {
		t.Fatal(err)
	}
	if line.Liveness != "owner-state" || line.Detail != why {
		t.Errorf("logged liveness %q detail %q, want owner-state and the reason", line.Liveness, line.Detail)
	}
}
