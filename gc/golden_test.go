package gc

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

var update = flag.Bool("update", false, "rewrite the golden plans under testdata/")

// scenario is a node described by the events that built its projection, in
// the journal's encoding, plus the disk, the policies and the time to plan
// at. A policy left out means that planner is not run.
type scenario struct {
	Comment         string               `json:"comment"`
	Now             time.Time            `json:"now"`
	Disk            DiskStats            `json:"disk"`
	ImagePolicy     *imagePolicyJSON     `json:"imagePolicy"`
	ContainerPolicy *containerPolicyJSON `json:"containerPolicy"`
	// PodsGone: the pods (by uid) whose log dir is gone, and since when.
	PodsGone map[string]time.Time `json:"podsGone,omitempty"`
	Events   []json.RawMessage    `json:"events"`
}

type imagePolicyJSON struct {
	HighThresholdPercent int      `json:"highThresholdPercent"`
	LowThresholdPercent  int      `json:"lowThresholdPercent"`
	MinAge               duration `json:"minAge"`
	MaxAge               duration `json:"maxAge"`
	SandboxImages        []string `json:"sandboxImages"`
	KeepPatterns         []string `json:"keepPatterns"`
	// FleetKeep is the fleet keep list with its state (known, unknown,
	// stale), FleetKeepWait the bound deletes wait for one never read.
	FleetKeep     *fleetKeepJSON `json:"fleetKeep"`
	FleetKeepWait duration       `json:"fleetKeepWait"`
}

type fleetKeepJSON struct {
	State    string    `json:"state"`
	Since    time.Time `json:"since"`
	Patterns []string  `json:"patterns"`
}

// keepList reads a fleet keep list of a scenario.
func (f *fleetKeepJSON) keepList(t *testing.T) KeepList {
	t.Helper()
	if f == nil {
		return KeepList{}
	}
	l := KeepList{Input: Input{Since: f.Since}, Patterns: f.Patterns}
	for _, s := range []InputState{InputUnknown, InputKnown, InputStale} {
		if s.String() == f.State {
			l.State = s
			return l
		}
	}
	t.Fatalf("fleet keep list state %q: want known, unknown or stale", f.State)
	return l
}

type containerPolicyJSON struct {
	MinAge          duration  `json:"minAge"`
	MaxPerEvictUnit int       `json:"maxPerEvictUnit"`
	MaxContainers   int       `json:"maxContainers"`
	Prune           PruneMode `json:"prune"`
}

// duration reads "2m"-style durations.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = duration(v)
	return err
}

// goldenPlans is what a scenario's golden file holds.
type goldenPlans struct {
	Images     *ImagePlan     `json:"images,omitempty"`
	Containers *ContainerPlan `json:"containers,omitempty"`
}

// TestGolden plans every testdata/*.scenario.json and compares the plans with
// the matching .plan.json; go test ./gc/ -update rewrites them.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.scenario.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios under testdata/")
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".scenario.json")
		t.Run(name, func(t *testing.T) {
			sc, s := loadScenario(t, file)
			got := plan(t, sc, s)
			if again := plan(t, sc, s.Clone()); !bytes.Equal(got, again) {
				t.Fatal("planning the same state twice gave different plans")
			}

			golden := filepath.Join("testdata", name+".plan.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./gc/ -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("plan differs from %s (review, then go test ./gc/ -update):\n%s", golden, diffLines(string(want), string(got)))
			}
		})
	}
}

// loadScenario reads a scenario and applies its events to a new state
// through the real reducer.
func loadScenario(t *testing.T, file string) (scenario, *projection.State) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var sc scenario
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	s := projection.New()
	for i, raw := range sc.Events {
		ev, err := events.Unmarshal(raw)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		s.Apply(ev)
	}
	return sc, s
}

// plan runs the planners the scenario configures, checks the invariants
// every plan must hold, and returns the plans as indented JSON.
func plan(t *testing.T, sc scenario, s *projection.State) []byte {
	t.Helper()
	var out goldenPlans
	if p := sc.ImagePolicy; p != nil {
		policy := ImagePolicy{
			HighThresholdPercent: p.HighThresholdPercent,
			LowThresholdPercent:  p.LowThresholdPercent,
			MinAge:               time.Duration(p.MinAge),
			MaxAge:               time.Duration(p.MaxAge),
			SandboxImages:        p.SandboxImages,
			KeepPatterns:         p.KeepPatterns,
			FleetKeep:            p.FleetKeep.keepList(t),
			FleetKeepWait:        time.Duration(p.FleetKeepWait),
		}
		if err := policy.Validate(); err != nil {
			t.Fatalf("image policy: %v", err)
		}
		plan := PlanImages([]*projection.State{s}, sc.Disk, policy, sc.Now)
		checkImagePlan(t, s, plan)
		checkReclaimable(t, s, policy, sc.Now)
		out.Images = &plan
	}
	if p := sc.ContainerPolicy; p != nil {
		policy := ContainerPolicy{
			MinAge:          time.Duration(p.MinAge),
			MaxPerEvictUnit: p.MaxPerEvictUnit,
			MaxContainers:   p.MaxContainers,
			Prune:           p.Prune,
		}
		if err := policy.Validate(); err != nil {
			t.Fatalf("container policy: %v", err)
		}
		gone := func(uid, _, _ string) (time.Time, bool) {
			since, ok := sc.PodsGone[uid]
			return since, ok
		}
		plan := planContainers(s, policy, sc.Now, gone, true)
		checkContainerPlan(t, s, policy, plan)
		if light := planContainers(s, policy, sc.Now, gone, false); !slices.Equal(containerSummary(light.Remove), containerSummary(plan.Remove)) ||
			!light.NextEligible.Equal(plan.NextEligible) {
			t.Errorf("a pass's plan removes %q, the full plan %q", containerSummary(light.Remove), containerSummary(plan.Remove))
		}
		out.Containers = &plan
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// diffLines shows the first lines where want and got differ, with context.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(i-3, 0)
	var b strings.Builder
	for j := from; j < i+5; j++ {
		if j < len(w) && (j >= len(g) || w[j] != g[j]) {
			b.WriteString("- " + w[j] + "\n")
		}
		if j < len(g) && (j >= len(w) || w[j] != g[j]) {
			b.WriteString("+ " + g[j] + "\n")
		}
		if j < i && j < len(w) {
			b.WriteString("  " + w[j] + "\n")
		}
	}
	return b.String()
}

// checkReclaimable asserts that ReclaimableBytes is what a plan on a full
// disk deletes or finds not needed.
func checkReclaimable(t *testing.T, s *projection.State, p ImagePolicy, now time.Time) {
	t.Helper()
	states := []*projection.State{s}
	if got, want := ReclaimableBytes(states, p, now), reclaimableByPlan(states, p, now); got != want {
		t.Errorf("ReclaimableBytes = %d, a plan on a full disk frees %d", got, want)
	}
}

// reclaimableByPlan is what a plan on a full disk deletes or finds not
// needed: what ReclaimableBytes must equal.
func reclaimableByPlan(states []*projection.State, p ImagePolicy, now time.Time) (n int64) {
	p.HighThresholdPercent, p.LowThresholdPercent = 0, 0
	plan := PlanImages(states, DiskStats{CapacityBytes: 1, AvailableBytes: 0}, p, now)
	for _, it := range plan.Delete {
		n += it.Size
	}
	for _, it := range plan.Keep {
		if it.Reason == ReasonNotNeeded {
			n += it.Size
		}
	}
	return n
}
