package gc

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// TestDeclaredMatch: the cluster keep list names exact normalized
// references; an image is held by any of its names as stored, in full
// form, or (tag and digest) by either part; a glob character is no glob.
func TestDeclaredMatch(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	declared := map[string]string{
		"docker.io/library/nginx:1.25":      "Deployment/shop/web",
		"docker.io/library/app@" + d:        "CronJob/batch/report",
		"registry.example/team/tool:latest": "Job/ci/build",
		"docker.io/library/star:*":          "Pod/x/odd",
	}
	for _, c := range []struct {
		name, want string
	}{
		{"docker.io/library/nginx:1.25", "docker.io/library/nginx:1.25"},
		{"nginx:1.25", "docker.io/library/nginx:1.25"},
		{"docker.io/library/app@" + d, "docker.io/library/app@" + d},
		{"docker.io/library/app:3@" + d, "docker.io/library/app@" + d},
		{"docker.io/library/nginx:1.25@" + d, "docker.io/library/nginx:1.25"},
		{"registry.example/team/tool", "registry.example/team/tool:latest"},
		// Not held.
		{"docker.io/library/nginx:1.26", ""},
		{"docker.io/library/app:3", ""},
		{"docker.io/library/star:1", ""},
		{"sha256:" + strings.Repeat("ab", 32), ""},
		{"not a name", ""},
	} {
		ref, by, ok := DeclaredMatch(declared, c.name)
		if ok != (c.want != "") || ref != c.want || (ok && by != declared[ref]) {
			t.Errorf("%s: %q %q %v, want %q", c.name, ref, by, ok, c.want)
		}
	}
}

// TestPlanKeepsWhatTheClusterDeclares: under pressure the plan keeps the
// images the cluster keep list names, saying by whom, and deletes the
// rest; 20,000 declared references cost no more than a lookup per name.
func TestPlanKeepsWhatTheClusterDeclares(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s := projection.New()
	for _, ev := range []events.ImageUpserted{
		{At: now.Add(-time.Hour), Name: "docker.io/library/report:7", Digest: "sha256:report", Size: 10},
		{At: now.Add(-time.Hour), Name: "docker.io/library/web:2", Digest: "sha256:web", Size: 10},
		{At: now.Add(-time.Hour), Name: "docker.io/library/old:1", Digest: "sha256:old", Size: 10},
	} {
		s.Apply(ev)
	}
	declared := map[string]string{"docker.io/library/report:7": "CronJob/batch/report", "docker.io/library/web:2": "Deployment/shop/web"}
	for i := range 20_000 {
		declared[fmt.Sprintf("registry.example/svc-%05d:v1", i)] = "Deployment/x/y"
	}
	p := ImagePolicy{HighThresholdPercent: 1, FleetKeep: KeepList{Input: Input{State: InputKnown}, Declared: declared}}
	plan := PlanImages([]*projection.State{s}, DiskStats{CapacityBytes: 100, AvailableBytes: 10}, p, now)
	if got := imageSummary(plan.Keep); !slices.Equal(got, []string{"sha256:report keep-pattern", "sha256:web keep-pattern"}) {
		t.Fatalf("keep %v", got)
	}
	for _, it := range plan.Keep {
		if !strings.Contains(it.Rule, "cluster keep list: docker.io/library/") || !strings.Contains(it.Rule, "declared by ") {
			t.Errorf("%s kept by %q", it.Digest, it.Rule)
		}
	}
	if got := imageSummary(plan.Delete); !slices.Equal(got, []string{"sha256:old space"}) {
		t.Fatalf("delete %v", got)
	}
}
