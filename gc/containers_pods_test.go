package gc

import (
	"slices"
	"testing"
	"time"
)

// TestPodDeletedOnlyBySeenThenGone: a stopped pod counts as deleted (its
// last dead container and newest sandbox go) only when the pod log dir is
// a known input and the pod's dir was seen there and went PodGrace ago.
// An input not read yet, stale, or one whose running pod's dir went
// (another dir than the kubelet's) keeps both, and makes the plan look
// again.
func TestPodDeletedOnlyBySeenThenGone(t *testing.T) {
	h := time.Hour
	s := build(flat(
		sandbox(0, "s1", "u1"), start(0, "s1"),
		criDead(time.Second, time.Minute, "c1", "app:1", "u1", "app", "s1"),
		exit(2*time.Minute, "s1"),
		// A pod that runs.
		sandbox(0, "s2", "u2"), start(0, "s2"),
	)...)
	p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll, PodGrace: time.Minute}
	now := at(h)
	gone := func(uids ...string) func(uid, _, _ string) (time.Time, bool) {
		return func(uid, _, _ string) (time.Time, bool) { return at(10 * time.Minute), slices.Contains(uids, uid) }
	}
	kept := []string{"c1 within-cap", "s1 pod-has-containers", "s2 running"}
	for _, tt := range []struct {
		name   string
		dir    PodLogDir
		remove []string
		keep   []string
		next   time.Time
		blind  bool
	}{
		{name: "no pod log dir read", dir: nil, keep: kept},
		{name: "not read yet", dir: PodLogDirView{In: Input{Cause: "not read yet"}, GoneFn: gone("u1")}, keep: kept, next: now.Add(PodRecheck)},
		{name: "stale", dir: PodLogDirView{In: Input{State: InputStale, Since: at(0)}, GoneFn: gone("u1")}, keep: kept, next: now.Add(PodRecheck)},
		{name: "known, dir there", dir: PodLogDirView{In: KnownInput(now)}, keep: kept, next: now.Add(PodRecheck)},
		{name: "known, a running pod's dir gone", dir: PodLogDirView{In: KnownInput(now), GoneFn: gone("u1", "u2")}, keep: kept, next: now.Add(PodRecheck), blind: true},
		{name: "known, seen and gone", dir: PodLogDirView{In: KnownInput(now), GoneFn: gone("u1")},
			remove: []string{"c1 pod-deleted", "s1 pod-deleted"}, keep: []string{"s2 running"}},
		{name: "known, gone within the grace", dir: PodLogDirView{In: KnownInput(now), GoneFn: func(uid, _, _ string) (time.Time, bool) {
			return now.Add(-30 * time.Second), uid == "u1"
		}}, keep: kept, next: now.Add(30 * time.Second)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			plan := PlanContainersWith(s, p, now, tt.dir)
			if got := containerSummary(plan.Remove); !slices.Equal(got, tt.remove) {
				t.Errorf("remove %q, want %q", got, tt.remove)
			}
			if got := containerSummary(plan.Keep); !slices.Equal(got, tt.keep) {
				t.Errorf("keep %q, want %q", got, tt.keep)
			}
			if !plan.NextEligible.Equal(tt.next) {
				t.Errorf("next look %v, want %v", plan.NextEligible, tt.next)
			}
			if plan.PodSignalBlind != tt.blind {
				t.Errorf("blind %v, want %v", plan.PodSignalBlind, tt.blind)
			}
			if tt.dir != nil && plan.PodLogDir != tt.dir.Input(now) {
				t.Errorf("plan's pod log dir %+v, want %+v", plan.PodLogDir, tt.dir.Input(now))
			}
		})
	}
}
