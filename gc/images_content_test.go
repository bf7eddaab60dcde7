package gc

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// withFacts gives a pulled image its content facts, as the source reads
// them from the content store.
func withFacts(ev events.ImageUpserted, config, chain string) events.ImageUpserted {
	ev.ConfigDigest, ev.ChainID = config, chain
	return ev
}

// TestPlanImagesInUseByContent: a container holds the image it runs, found
// by CRI's image id, by the parent of its rootfs snapshot or as an image
// volume, never by whatever its image name points at now.
func TestPlanImagesInUseByContent(t *testing.T) {
	old, fresh := digestOf("app-old"), digestOf("app-new")
	vol, sbVol, idle := digestOf("vol"), digestOf("sbvol"), digestOf("idle")
	tests := []struct {
		name   string
		ctr    events.ContainerUpserted
		digest string // the image the container holds
		reason Reason
	}{
		{"CRI container after its tag moved", func() events.ContainerUpserted {
			c := criContainer(time.Minute, "c1", "example.test/app:1", "pod", "app", "sb")
			c.ImageID = "sha256:cfg-old"
			return c
		}(), old, ReasonInUseByID},
		{"plain container after its tag moved", func() events.ContainerUpserted {
			c := native(time.Minute, "n1", "example.test/app:1")
			c.RootChain = "sha256:chain-old"
			return c
		}(), old, ReasonInUseBySnap},
		{"image volume of a CRI container", func() events.ContainerUpserted {
			c := criContainer(time.Minute, "c2", "example.test/idle:1", "pod", "app", "sb")
			c.ImageID, c.VolumeImageIDs = "sha256:cfg-idle", []string{"sha256:cfg-vol"}
			return c
		}(), vol, ReasonImageVolume},
		{"image volume held by a sandbox's lease", func() events.ContainerUpserted {
			c := sandbox(time.Minute, "sb", "pod")
			c.RootChain, c.VolumeChains = "sha256:chain-idle", []string{"sha256:chain-sbvol"}
			return c
		}(), sbVol, ReasonImageVolume},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := build(
				withFacts(pull(0, "sha256:cfg-old", old, 4*mib), "sha256:cfg-old", "sha256:chain-old"),
				withFacts(pull(0, "example.test/app:1", fresh, 4*mib), "sha256:cfg-new", "sha256:chain-new"),
				withFacts(pull(0, "example.test/vol:1", vol, 4*mib), "sha256:cfg-vol", "sha256:chain-vol"),
				withFacts(pull(0, "example.test/sbvol:1", sbVol, 4*mib), "sha256:cfg-sbvol", "sha256:chain-sbvol"),
				withFacts(pull(0, "example.test/idle:1", idle, 4*mib), "sha256:cfg-idle", "sha256:chain-idle"),
				tt.ctr,
				events.Synced{At: at(time.Minute)},
			)
			full := DiskStats{CapacityBytes: 100 * mib, AvailableBytes: 1 * mib}
			plan := PlanImages([]*projection.State{s}, full, ImagePolicy{HighThresholdPercent: 85, LowThresholdPercent: 80}, at(time.Hour))
			got := map[string]ImageItem{}
			for _, it := range slices.Concat(plan.Delete, plan.Keep) {
				got[it.Digest] = it
			}
			if it := got[tt.digest]; it.Reason != tt.reason || !slices.Contains(it.Users, tt.ctr.ID) {
				t.Errorf("%s: reason %q users %v, want %q by %s", tt.digest, it.Reason, it.Users, tt.reason, tt.ctr.ID)
			}
			// The image the moved name points at now is not held by the
			// container, so it goes under pressure.
			if it := got[fresh]; it.Reason != ReasonSpace {
				t.Errorf("the tag's new image: reason %q, want %q", it.Reason, ReasonSpace)
			}
		})
	}
}

// TestLastUsedFollowsContent: when the last container holding an image by
// content goes, the image's last-used time is that moment; an image that
// appears while held counts as used from then on.
func TestLastUsedFollowsContent(t *testing.T) {
	old := digestOf("old")
	c := native(time.Minute, "n1", "example.test/app:1")
	c.RootChain = "sha256:chain-old"
	s := build(c, withFacts(pull(2*time.Minute, "sha256:cfg-old", old, mib), "sha256:cfg-old", "sha256:chain-old"))
	img := s.Images[old]
	if !s.InUse(old) || !s.LastUsed(img, at(time.Hour)).Equal(at(time.Hour)) {
		t.Fatalf("image that appears while held: in use %v, last used %v", s.InUse(old), s.LastUsed(img, at(time.Hour)))
	}
	s.Apply(remove(3*time.Minute, "n1"))
	if s.InUse(old) || !img.LastUsed.Time().Equal(at(3*time.Minute)) {
		t.Fatalf("after its container went: in use %v, last used %v, want %v", s.InUse(old), img.LastUsed, at(3*time.Minute))
	}
}

// TestImageExecutorRecheckByContent: the re-check right before a delete
// asks the runtime by content too: a container or image volume created from
// the image's top layer or config since the plan keeps it, whatever its name.
func TestImageExecutorRecheckByContent(t *testing.T) {
	a := digestOf("a")
	for _, key := range []string{"chain:sha256:chain-a", "config:sha256:cfg-a"} {
		t.Run(key, func(t *testing.T) {
			n := newNode()
			n.state.Apply(withFacts(pull(0, "example.test/a:1", a, 4*mib), "sha256:cfg-a", "sha256:chain-a"))
			plan := n.plan(policy8070, at(time.Hour))
			n.rt.Use(key, "late")
			res := n.executor(policy8070).execute(context.Background(), plan)
			if slices.Contains(n.rt.Removed(), a) {
				t.Fatalf("removed %s though %s holds it", a, key)
			}
			if got := reasons(res.Outcomes)[a]; got != ReasonInUse {
				t.Errorf("skip reason %q, want %q", got, ReasonInUse)
			}
		})
	}
}

// TestKeepPatternsMatchNormalizedNames: a keep pattern written the way
// people write images (nginx:*) keeps the image containerd stores under its
// normalized name, and the full spelling works too.
func TestKeepPatternsMatchNormalizedNames(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"nginx:*", "docker.io/library/nginx:1.25", true},
		{"docker.io/library/nginx:*", "docker.io/library/nginx:1.25", true},
		{"library/nginx:*", "docker.io/library/nginx:1.25", false},
		{"nginx:*", "docker.io/other/nginx:1.25", false},
		{"other/*", "docker.io/other/nginx:1.25", true},
		{"registry.k8s.io/pause:*", "registry.k8s.io/pause:3.10", true},
		{"pause:*", "registry.k8s.io/pause:3.10", false},
		{"sha256:*", "sha256:0123", true},
	}
	for _, tt := range tests {
		if got := keepMatch(tt.pattern, tt.name); got != tt.want {
			t.Errorf("keepMatch(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

// TestNewestSandboxKeptWhilePodLogDirExists: with --prune-containers=all,
// a pod with no container left loses its newest sandbox only when podKept
// says the pod is gone (the kubelet removed its log dir); older sandboxes
// of the same pod go either way.
func TestNewestSandboxKeptWhilePodLogDirExists(t *testing.T) {
	s := build(flat(
		sandbox(0, "old", "u1"), start(0, "old"), exit(time.Minute, "old"),
		sandbox(2*time.Minute, "new", "u1"), start(2*time.Minute, "new"), exit(3*time.Minute, "new"),
	)...)
	p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneAll}
	for _, tt := range []struct {
		name   string
		kept   bool
		remove []string
		keep   []string
	}{
		{"log dir exists", true, []string{"old sandbox-orphaned"}, []string{"new newest-sandbox"}},
		{"log dir gone", false, []string{"old pod-deleted", "new pod-deleted"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			plan := PlanContainersWith(s, p, at(time.Hour), PodLogDirView{In: KnownInput(at(time.Hour)), GoneFn: func(uid, ns, name string) (time.Time, bool) {
				asked = append(asked, ns+"/"+name+"/"+uid)
				return at(0), !tt.kept
			}})
			if got := containerSummary(plan.Remove); !slices.Equal(got, tt.remove) {
				t.Errorf("remove %q, want %q", got, tt.remove)
			}
			if got := containerSummary(plan.Keep); !slices.Equal(got, tt.keep) {
				t.Errorf("keep %q, want %q", got, tt.keep)
			}
			if !slices.Equal(asked, []string{"default/pod-u1/u1"}) {
				t.Errorf("asked about %q, want its pod once", asked)
			}
			if want := at(time.Hour).Add(PodRecheck); tt.kept && !plan.NextEligible.Equal(want) {
				t.Errorf("next look %v, want %v: the log dir goes without an event", plan.NextEligible, want)
			}
		})
	}
}
