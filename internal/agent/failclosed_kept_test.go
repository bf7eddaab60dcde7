package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
)

// TestKeptCounts (issue 40 item 5): what the planners keep only for an
// input's sake is counted by input and kind (what the kubelet's own rules
// keep is not): images a keep list never read holds or a stale one keeps,
// containers of pods no deleted-pod sign judges, links and dirs the log
// cleaner keeps for an input.
func TestKeptCounts(t *testing.T) {
	doc := &Plan{Images: gc.ImagePlan{Keep: []gc.ImageItem{
		{Reason: gc.ReasonKeepListUnread}, {Reason: gc.ReasonKeepListUnread},
		{Reason: gc.ReasonKeepPattern, Rule: gc.FleetRule("app:*")},
		{Reason: gc.ReasonKeepPattern, Rule: gc.DeclaredRule("docker.io/library/x:1", "CronJob/a/b")},
		{Reason: gc.ReasonKeepPattern, Rule: "app:*"}, // --keep-image: policy, not an input
		{Reason: gc.ReasonTooYoung}, {Reason: gc.ReasonInUse},
	}}, Containers: gc.ContainerPlan{KeptUnjudged: 3}, Logs: logs.Plan{Decisions: []logs.Decision{
		{Kind: logs.KindSymlink, Action: logs.ActionKeep, Reason: logs.ReasonUnverified},
		{Kind: logs.KindSymlink, Action: logs.ActionKeep, Reason: logs.ReasonTargetExists},
		{Kind: logs.KindPodDir, Action: logs.ActionKeep, Reason: logs.ReasonNotSynced},
		{Kind: logs.KindPodDir, Action: logs.ActionRemove, Reason: logs.ReasonPodGone},
	}}}
	stale := gc.ImagePolicy{FleetKeep: gc.KeepList{Input: gc.Input{State: gc.InputStale, Since: time.Now()}}}
	got := planKept(doc, stale)
	want := []FailClosedKept{
		{Input: inputKeepList, Kind: "image", Count: 2, Why: "stale"},
		{Input: inputKeepList, Kind: "image", Count: 2, Why: "unknown"},
		{Input: inputPodLogDir, Kind: "container", Count: 3, Why: "unknown"},
		{Input: inputPodLogDir, Kind: "link", Count: 1, Why: string(logs.ReasonUnverified)},
		{Input: inputProjection, Kind: "dir", Count: 1, Why: string(logs.ReasonNotSynced)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// A known list's patterns keep by policy: nothing kept for an input.
	known := gc.ImagePolicy{FleetKeep: gc.KeepList{Input: gc.Input{State: gc.InputKnown}}}
	if got := planKept(&Plan{Images: gc.ImagePlan{Keep: []gc.ImageItem{{Reason: gc.ReasonKeepPattern, Rule: gc.FleetRule("app:*")}}}}, known); len(got) != 0 {
		t.Fatalf("known list: %+v", got)
	}
}
