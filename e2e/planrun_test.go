package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/testenv"
)

// TestPlanPredictsRun: on a fresh node, `gcagent plan` (no agent, no
// state) names the images the agent's first run deletes, in the order it
// deletes them; with the agent running, plan asks it and prints the same,
// and with another threshold plans that threshold from the agent's history
// while the agent goes on with its own.
// The images were imported in an order other than their digests', so a
// plan that aged them from containerd's creation times (the old plan)
// would name another order than the agent, which sees them all first at
// its start and breaks the tie by digest.
func TestPlanPredictsRun(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testPlanPredictsRun(t, v) })
	}
}

func testPlanPredictsRun(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "160m"})
	imgs := []testenv.Image{testenv.Pause(c.SandboxImage), testenv.Runnable("keep.test/tools:1", testenv.Layer{Seed: "keep", Size: 4 * imgMiB})}
	for _, n := range []string{"e", "b", "d", "a", "c"} {
		imgs = append(imgs, testenv.Runnable("example.test/app-"+n+":1", testenv.Layer{Seed: "planrun-" + n, Size: 6 * imgMiB}))
	}
	digestOf := map[string]string{}
	for _, r := range c.Import(t, imgs...) {
		digestOf[r.Name] = r.Target.Digest.String()
	}
	var mu sync.Mutex
	var deleted []string // in the order containerd deleted them
	followEvents(t, c, func(_ *cdevents.Envelope, ev any) {
		// Only the names imported: CRI's sha256: id names go with them.
		if d, ok := ev.(*apievents.ImageDelete); ok && digestOf[d.Name] != "" {
			mu.Lock()
			deleted = append(deleted, digestOf[d.Name])
			mu.Unlock()
		}
	}, nil)

	// Usage is over the high threshold and the low one is out of reach:
	// every image no rule keeps goes, so the whole order is compared.
	capacity, used := imgDisk(t, c.Root)
	high := int(used*100/capacity) - 1
	state := filepath.Join(t.TempDir(), "state")
	addr := testenv.FreeAddr(t)
	flags := []string{"--namespace", testenv.Namespace, "--image-fs", c.Root, "--state-dir", state,
		"--metrics-address", addr, fmt.Sprintf("--image-gc-high-threshold=%d", high), "--image-gc-low-threshold=0",
		"--minimum-image-ttl-duration=30s", "--keep-image=keep.test/*", "--prune-containers=off"}
	plan := func(extra ...string) agent.Plan {
		t.Helper()
		args := append(append([]string{"plan", "--json", "--containerd-address", c.Address}, flags...), extra...)
		out, err := exec.Command(testenv.AgentBinary(t), args...).Output()
		if err != nil {
			t.Fatalf("gcagent plan: %v", err)
		}
		var doc agent.Plan
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("plan output: %v\n%s", err, out)
		}
		return doc
	}
	digests := func(items []gc.ImageItem) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.Digest)
		}
		return out
	}

	fresh := plan()
	if fresh.History != "none" || len(fresh.Images.Delete) != 0 || fresh.Next == nil {
		t.Fatalf("fresh plan: history %q, %d to delete now, next %v; want none, 0 and a next pass", fresh.History, len(fresh.Images.Delete), fresh.Next != nil)
	}
	predicted := digests(fresh.Next.Delete)
	var want []string
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		want = append(want, digestOf["example.test/app-"+n+":1"])
	}
	if !sameSet(predicted, want) {
		t.Fatalf("fresh plan deletes %v, want the five app images %v", predicted, want)
	}
	if !slices.IsSorted(predicted) {
		t.Errorf("fresh plan order %v: images first seen together go by digest", predicted)
	}

	a := testenv.StartAgent(t, c, state, flags[6:]...) // the same settings; --metrics-address wins over its own
	a.Addr = addr
	testenv.Eventually(t, 20*time.Second, func() string {
		var st imgStatus
		if code, err := a.Get("/status", &st); err != nil || code != 200 || st.ImageGC == nil || st.ImageGC.LastPass == nil {
			return fmt.Sprintf("no image gc pass yet (%d %v)", code, err)
		}
		return ""
	})
	running := plan()
	if running.History != "agent" || running.Next == nil {
		t.Fatalf("plan with the agent running: history %q (%s), next %v; want the agent's own plan", running.History, running.HistoryNote, running.Next != nil)
	}
	if got := digests(running.Next.Delete); !slices.Equal(got, predicted) {
		t.Errorf("the running agent's plan deletes %v, the fresh plan %v", got, predicted)
	}
	// What if the threshold were 100 (image GC off)? The agent plans it
	// from its own history and says so, and goes on with its own policy:
	// it still deletes what the plans above predicted (below).
	whatIf := plan("--image-gc-high-threshold=100")
	if whatIf.History != "agent" || !slices.Equal(whatIf.WhatIf, []string{"image-gc-high-threshold"}) ||
		len(whatIf.Images.Delete) != 0 || whatIf.Next != nil || whatIf.Images.Triggered {
		t.Errorf("what-if plan: history %q, what-if %v, %d to delete, next %v, triggered %v; want the agent's, [image-gc-high-threshold], none",
			whatIf.History, whatIf.WhatIf, len(whatIf.Images.Delete), whatIf.Next != nil, whatIf.Images.Triggered)
	}

	testenv.Eventually(t, 90*time.Second, func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(deleted) < len(predicted) {
			return fmt.Sprintf("%d of %d images deleted", len(deleted), len(predicted))
		}
		return ""
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(deleted, predicted) {
		t.Errorf("the agent deleted %v, plan predicted %v", deleted, predicted)
	}
	t.Logf("%s: plan and run agree on %d images in order", v, len(predicted))
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
