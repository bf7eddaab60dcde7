package gc

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

func TestContainerPolicyValidate(t *testing.T) {
	ok := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneNative}
	tests := []struct {
		name string
		mod  func(*ContainerPolicy)
		want string // substring of the error; empty for valid
	}{
		{"defaults", func(*ContainerPolicy) {}, ""},
		{"zero caps", func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers = 0, 0 }, ""},
		{"prune all", func(p *ContainerPolicy) { p.Prune = PruneAll }, ""},
		{"prune off", func(p *ContainerPolicy) { p.Prune = PruneOff }, ""},
		{"negative min age", func(p *ContainerPolicy) { p.MinAge = -time.Second }, "minimum container age -1s"},
		{"per unit below -1", func(p *ContainerPolicy) { p.MaxPerEvictUnit = -2 }, "per container -2"},
		{"global below -1", func(p *ContainerPolicy) { p.MaxContainers = -2 }, "dead containers -2"},
		{"empty prune mode", func(p *ContainerPolicy) { p.Prune = "" }, `prune mode ""`},
		{"unknown prune mode", func(p *ContainerPolicy) { p.Prune = "cri" }, `prune mode "cri"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.mod(&p)
			wantError(t, p.Validate(), tt.want)
		})
	}
}

func TestPlanContainers(t *testing.T) {
	tests := []struct {
		name   string
		evs    []events.Event
		mod    func(*ContainerPolicy)   // applied to the defaults: 0s, 1 per unit, no global cap, native
		now    time.Duration            // since t0; 10h when zero
		gone   map[string]time.Duration // pods (by uid) whose log dir is gone, since t0+d
		remove []string                 // "id reason", in plan order
		keep   []string                 // "id reason", by id
		check  func(*testing.T, ContainerPlan)
	}{
		{
			// The kubelet's order: by creation (c3, created first, goes
			// though it exited last).
			name: "per-unit cap keeps the newest of each unit, oldest go first",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"),
				criDead(h, 5*h, "c3", "app:1", "u1", "app", "s1"), // created first, exits last
				criDead(2*h, m, "c2", "app:1", "u1", "app", "s1"),
				criDead(3*h, m, "c1", "app:1", "u1", "app", "s1"),
				criDead(h, m, "side", "side:1", "u1", "sidecar", "s1"),
				solo(h, m, "n1", "tool:1"), solo(h, m, "n2", "tool:1"),
			),
			mod:    func(p *ContainerPolicy) { p.Prune = PruneAll },
			remove: []string{"c3 per-unit-cap", "c2 per-unit-cap"},
			keep:   []string{"c1 within-cap", "n1 within-cap", "n2 within-cap", "s1 running", "side within-cap"},
		},
		{
			name:   "per-unit cap 0 removes every dead container",
			evs:    flat(solo(h, m, "n1", "tool:1"), solo(0, m, "n2", "tool:1")),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.Prune = 0, PruneAll },
			remove: []string{"n2 per-unit-cap", "n1 per-unit-cap"},
		},
		{
			name: "no limits keep every dead container",
			evs: flat(
				criDead(h, m, "c1", "app:1", "u1", "app", "s1"), criDead(2*h, m, "c2", "app:1", "u1", "app", "s1"),
				solo(h, m, "n1", "tool:1"),
			),
			mod:  func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.Prune = -1, PruneAll },
			keep: []string{"c1 within-cap", "c2 within-cap", "n1 within-cap"},
		},
		{
			// Plain containers have no restarts: no per-unit cap. They go once
			// their owner is done (it collected the exit status, or the grace
			// passed) and the TTL has passed since; never while a restart
			// policy wants them running or right after a client's operation.
			name: "plain containers go when their owner is done, past the TTL",
			evs: flat(
				dead(0, h, "old", "tool:1"),                         // uncollected for 9h
				dead(0, 10*h-10*time.Second, "fresh", "tool:1"),     // exited 10s ago, uncollected
				dead(0, 10*h-30*time.Second, "collected", "tool:1"), // exited 30s ago,
				collect(10*h-25*time.Second, "collected"),           //   collected 25s ago
				dead(0, 10*h-2*m, "collected-old", "tool:1"),        // collected long enough ago
				collect(10*h-2*m, "collected-old"),                  //
				restarted(0, 5*h, "always", "tool:1"),               // a restart policy wants it running
				native(0, "idle", "tool:1"),
			),
			mod:    func(p *ContainerPolicy) { p.MinAge = 30 * time.Second },
			remove: []string{"old ttl-expired", "collected-old ttl-expired"},
			keep: []string{"always restart-managed", "collected too-young", "fresh awaiting-collection",
				"idle never-started"},
			check: func(t *testing.T, p ContainerPlan) {
				// collected: 25s ago + 30s TTL; fresh: 10s grace from now + 30s.
				if want := at(10*h + 5*time.Second); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v", p.NextEligible, want)
				}
				// old became removable at its exit + 10s grace + 30s TTL.
				if want := at(h + 40*time.Second); p.Remove[0].ID != "old" || !p.Remove[0].EligibleAt.Equal(want) {
					t.Errorf("%s eligible at %v, want old at %v", p.Remove[0].ID, p.Remove[0].EligibleAt, want)
				}
			},
		},
		{
			name: "plain containers: a client's operation in the last second keeps it (owner-active)",
			evs: flat(
				dead(0, 10*h-time.Minute, "busy", "tool:1"), collect(10*h-500*time.Millisecond, "busy"),
			),
			remove: nil,
			keep:   []string{"busy owner-active"},
			check: func(t *testing.T, p ContainerPlan) {
				if want := at(10*h + 500*time.Millisecond); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v", p.NextEligible, want)
				}
			},
		},
		{
			name:   "plain containers: no per-unit cap, and the default policy removes them",
			evs:    flat(dead(0, h, "a", "tool:1"), dead(h, h, "b", "tool:1"), collect(3*h, "b")),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit = 5 },
			remove: []string{"a ttl-expired", "b ttl-expired"},
		},
		{
			name: "global cap over many units: each keeps at least one, then the oldest go",
			evs: flat(
				solo(1*h, m, "n1", "tool:1"), solo(2*h, m, "n2", "tool:1"), solo(3*h, m, "n3", "tool:1"),
				solo(4*h, m, "n4", "tool:1"), solo(5*h, m, "n5", "tool:1"),
				criDead(0, m, "c1", "app:1", "u1", "app", "s1"), criDead(6*h, m, "c2", "app:1", "u1", "app", "s1"),
				criDead(7*h, m, "c3", "app:1", "u1", "app", "s1"),
			),
			mod: func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = -1, 3, PruneAll },
			// 6 units for 3 slots: 1 per unit (floor 1) drops c1 and c2, then
			// the oldest of the 6 left go until 3 remain.
			remove: []string{"c1 global-cap", "n1 global-cap", "n2 global-cap", "n3 global-cap", "c2 global-cap"},
			keep:   []string{"c3 within-cap", "n4 within-cap", "n5 within-cap"},
		},
		{
			name: "global cap split evenly between units",
			evs: flat(
				criDead(1*h, m, "a1", "app:1", "u1", "a", "s1"), criDead(2*h, m, "a2", "app:1", "u1", "a", "s1"),
				criDead(3*h, m, "a3", "app:1", "u1", "a", "s1"), criDead(4*h, m, "a4", "app:1", "u1", "a", "s1"),
				criDead(5*h, m, "b1", "app:1", "u2", "b", "s2"), criDead(6*h, m, "b2", "app:1", "u2", "b", "s2"),
				criDead(7*h, m, "b3", "app:1", "u2", "b", "s2"), criDead(8*h, m, "b4", "app:1", "u2", "b", "s2"),
			),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = -1, 4, PruneAll },
			remove: []string{"a1 global-cap", "a2 global-cap", "b1 global-cap", "b2 global-cap"},
			keep:   []string{"a3 within-cap", "a4 within-cap", "b3 within-cap", "b4 within-cap"},
		},
		{
			name: "per-unit cap then global cap",
			evs: flat(
				solo(1*h, m, "n1", "tool:1"),
				criDead(2*h, m, "a1", "app:1", "u1", "a", "s1"), criDead(3*h, m, "a2", "app:1", "u1", "a", "s1"),
			),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = 1, 1, PruneAll },
			remove: []string{"n1 global-cap", "a1 per-unit-cap"},
			keep:   []string{"a2 within-cap"},
		},
		{
			name:   "global cap 0 removes every dead container",
			evs:    flat(solo(1*h, m, "n1", "tool:1"), solo(2*h, m, "n2", "tool:1")),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = -1, 0, PruneAll },
			remove: []string{"n1 global-cap", "n2 global-cap"},
		},
		{
			name: "min age counts from the exit, and young containers do not count towards caps",
			evs: flat(
				solo(0, 10*h-10*time.Second, "late", "tool:1"), // created long ago, exited 10s ago
				solo(9*h, h-30*time.Second, "later", "tool:1"),
				criDead(h, m, "old", "app:1", "u1", "app", "s1"),
				criDead(2*h, 8*h-5*time.Second, "young", "app:1", "u1", "app", "s1"),
			),
			mod:  func(p *ContainerPolicy) { p.MinAge, p.MaxPerEvictUnit, p.Prune = m, 1, PruneAll },
			keep: []string{"late too-young", "later too-young", "old within-cap", "young too-young"},
			check: func(t *testing.T, p ContainerPlan) {
				if want := at(10*h + 30*time.Second); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v", p.NextEligible, want)
				}
				if want := at(10*h + 50*time.Second); !p.Keep[0].EligibleAt.Equal(want) {
					t.Errorf("late eligible at %v, want %v", p.Keep[0].EligibleAt, want)
				}
			},
		},
		{
			name:   "min age passed exactly",
			evs:    flat(solo(0, 10*h-m, "n1", "tool:1")),
			mod:    func(p *ContainerPolicy) { p.MinAge, p.MaxPerEvictUnit, p.Prune = m, 0, PruneAll },
			remove: []string{"n1 per-unit-cap"},
			check: func(t *testing.T, p ContainerPlan) {
				if !p.NextEligible.IsZero() {
					t.Errorf("next eligible = %v, want zero", p.NextEligible)
				}
			},
		},
		{
			name: "running, restarted and never-started containers are kept",
			evs: flat(
				native(0, "created", "tool:1"),
				native(0, "running", "tool:1"), start(h, "running"),
				dead(0, h, "restarted", "tool:1"), start(2*h, "restarted"),
				criContainer(10*h-30*time.Second, "cri-created", "app:1", "u1", "app", "s1"), // about to start
			),
			mod:  func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = 0, 0, PruneAll },
			keep: []string{"created never-started", "cri-created starting", "restarted running", "running running"},
			check: func(t *testing.T, p ContainerPlan) {
				if want := at(10*h + 30*time.Second); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v (created + NeverStartedGrace)", p.NextEligible, want)
				}
			},
		},
		{
			name: "prune native leaves CRI containers and sandboxes",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), exit(h, "s1"),
				criDead(0, m, "c1", "app:1", "u1", "app", "s1"),
				dead(0, m, "n1", "tool:1"),
			),
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit = 0 },
			remove: []string{"n1 ttl-expired"},
			keep:   []string{"c1 prune-mode", "s1 prune-mode"},
		},
		{
			name: "prune off leaves every container",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), exit(h, "s1"),
				dead(0, m, "n1", "tool:1"), native(0, "n2", "tool:1"), start(0, "n2"),
			),
			mod:  func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = 0, 0, PruneOff },
			keep: []string{"n1 prune-mode", "n2 running", "s1 prune-mode"},
		},
		{
			name: "prune all: a sandbox goes once no container is in it, unless it is its live pod's newest",
			evs: flat(
				// u1: the kubelet already removed the containers.
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"),
				exit(h, "s1"), remove(2*h, "c1"),
				// u2: a dead container within the cap keeps the sandbox.
				sandbox(0, "s2", "u2"), start(0, "s2"), criDead(0, m, "c2", "app:1", "u2", "app", "s2"), exit(h, "s2"),
				// u3: the cap removes one container, the other keeps the sandbox.
				sandbox(0, "s3", "u3"), start(0, "s3"), exit(h, "s3"),
				criDead(0, m, "c3a", "app:1", "u3", "app", "s3"), criDead(m, m, "c3b", "app:1", "u3", "app", "s3"),
				// u4: the sandbox runs.
				sandbox(0, "s4", "u4"), start(0, "s4"),
				// u5: a container that names the sandbox but not the pod.
				sandbox(0, "s5", "u5"), start(0, "s5"), exit(h, "s5"),
				criContainer(0, "c5", "app:1", "", "", "s5"),
				// u6: an old exited sandbox and a new running one, no containers.
				sandbox(0, "s6old", "u6"), start(0, "s6old"), exit(m, "s6old"), sandbox(m, "s6new", "u6"), start(m, "s6new"),
				// u7: an old exited sandbox; the pod's container runs in the new one.
				sandbox(0, "s7old", "u7"), start(0, "s7old"), exit(m, "s7old"), sandbox(m, "s7new", "u7"), start(m, "s7new"),
				criContainer(m, "c7", "app:1", "u7", "app", "s7new"), start(m, "c7"),
				// A sandbox without a pod uid is not held by c5, which has none either.
				sandbox(0, "s8", ""), start(0, "s8"), exit(h, "s8"),
			),
			mod: func(p *ContainerPolicy) { p.Prune = PruneAll },
			// s1: the newest sandbox of a pod that is there (its log dir is).
			// c5: never started, 10h ago: dead. s7old: c7 is in s7new.
			remove: []string{"c3a per-unit-cap", "s6old sandbox-orphaned", "s7old sandbox-orphaned", "s8 sandbox-orphaned"},
			keep: []string{
				"c2 within-cap", "c3b within-cap", "c5 within-cap", "c7 running", "s1 newest-sandbox", "s2 pod-has-containers", "s3 pod-has-containers", "s4 running", "s5 pod-has-containers",
				"s6new running", "s7new running",
			},
			check: func(t *testing.T, p ContainerPlan) {
				for _, it := range p.Keep {
					if it.ID == "s3" && !slices.Equal(it.Containers, []string{"c3b"}) {
						t.Errorf("s3 kept by %q, want [c3b]", it.Containers)
					}
				}
			},
		},
		{
			// Class 1 of issue 30: the kubelet looks at the containers in a
			// sandbox, not at its pod's, so a restarted pod's old, empty
			// sandboxes go while its dead containers stay.
			name: "prune all: an empty old sandbox goes though its pod keeps dead containers",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"), exit(h, "s1"),
				sandbox(h, "s2", "u1"), start(h, "s2"), criDead(h, m, "c2", "app:1", "u1", "app", "s2"), exit(2*h, "s2"),
			),
			mod:    func(p *ContainerPolicy) { p.Prune = PruneAll },
			remove: []string{"c1 per-unit-cap", "s1 sandbox-orphaned"},
			keep:   []string{"c2 within-cap", "s2 pod-has-containers"},
		},
		{
			// Class 5: the kubelet has no minimum age for sandboxes; a live
			// pod's newest sandbox stays whatever its age.
			name: "prune all: no min age for sandboxes",
			evs: flat(
				sandbox(0, "s0", "u1"), start(0, "s0"), exit(10*h-2*time.Second, "s0"),
				sandbox(time.Second, "s1", "u1"), start(time.Second, "s1"), exit(10*h-time.Second, "s1"),
				sandbox(0, "s2", "u2"),
			),
			mod:    func(p *ContainerPolicy) { p.MinAge, p.Prune = h, PruneAll },
			remove: []string{"s0 sandbox-orphaned"},
			keep:   []string{"s1 newest-sandbox", "s2 never-started"},
		},
		{
			// Classes 2 and 6: a deleted pod's dead containers all go,
			// whatever the per-unit cap, and its sandboxes with them in the
			// same plan; MinAge still holds for containers.
			name: "prune all: a deleted pod leaves nothing",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"), exit(h, "s1"),
				sandbox(h, "s2", "u1"), start(h, "s2"),
				criDead(h, m, "c2", "app:1", "u1", "app", "s2"), criDead(2*h, m, "c3", "app:1", "u1", "app", "s2"),
				criDead(h, m, "side", "side:1", "u1", "side", "s2"), exit(3*h, "s2"),
				// u2 is deleted too, but its newest container is too young.
				sandbox(0, "t1", "u2"), start(0, "t1"), criDead(0, 10*h-10*time.Second, "d1", "app:1", "u2", "app", "t1"), exit(10*h-5*time.Second, "t1"),
			),
			gone:   map[string]time.Duration{"u1": 4 * h, "u2": 4 * h},
			mod:    func(p *ContainerPolicy) { p.MinAge, p.Prune = 30*time.Second, PruneAll },
			remove: []string{"c1 pod-deleted", "c2 pod-deleted", "side pod-deleted", "c3 pod-deleted", "s1 pod-deleted", "s2 pod-deleted"},
			keep:   []string{"d1 too-young", "t1 pod-has-containers"},
			check: func(t *testing.T, p ContainerPlan) {
				if want := at(10*h + 20*time.Second); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v (d1 past MinAge)", p.NextEligible, want)
				}
			},
		},
		{
			// Class 3: the kubelet drops deleted pods' units before it
			// shares MaxContainers: the live pod gets 2, not 2/3 (so 1).
			name: "prune all: the global cap is shared among the units of pods that are there",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), exit(h, "s1"),
				criDead(0, m, "x1", "app:1", "u1", "x", "s1"), criDead(0, m, "y1", "app:1", "u1", "y", "s1"),
				sandbox(0, "s2", "u2"), start(0, "s2"),
				criDead(h, m, "a1", "app:1", "u2", "a", "s2"), criDead(2*h, m, "a2", "app:1", "u2", "a", "s2"),
				criDead(3*h, m, "a3", "app:1", "u2", "a", "s2"),
			),
			gone:   map[string]time.Duration{"u1": 2 * h},
			mod:    func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.MaxContainers, p.Prune = -1, 2, PruneAll },
			remove: []string{"x1 pod-deleted", "y1 pod-deleted", "a1 global-cap", "s1 pod-deleted"},
			keep:   []string{"a2 within-cap", "a3 within-cap", "s2 running"},
		},
		{
			// containerd's creation time is its wall clock: after a step
			// forward it looks old at once. The start grace counts also
			// from when the agent first saw the container.
			name: "prune all: a never-started container seen just now is starting, whatever its creation time",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"),
				func() events.ContainerUpserted {
					c := criContainer(10*h-20*time.Second, "c1", "app:1", "u1", "c", "s1")
					c.Created = at(h)
					return c
				}(),
			),
			mod:  func(p *ContainerPolicy) { p.MaxPerEvictUnit, p.Prune = 0, PruneAll },
			keep: []string{"c1 starting", "s1 running"},
		},
		{
			// Class 4: a CRI container created and never started (its
			// start failed) is dead once NeverStartedGrace (and MinAge)
			// have passed since its creation, and counts under the caps.
			name: "prune all: a never-started CRI container is dead after the grace",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"),
				criDead(h, m, "a1", "app:1", "u1", "a", "s1"), criContainer(2*h, "a2", "app:1", "u1", "a", "s1"),
				criDead(h, m, "b1", "app:1", "u1", "b", "s1"), criContainer(10*h-2*m, "b2", "app:1", "u1", "b", "s1"),
				criContainer(10*h-20*time.Second, "c1", "app:1", "u1", "c", "s1"),
			),
			mod:    func(p *ContainerPolicy) { p.MinAge, p.Prune = m, PruneAll },
			remove: []string{"a1 per-unit-cap", "b1 per-unit-cap"},
			keep:   []string{"a2 within-cap", "b2 within-cap", "c1 starting", "s1 running"},
			check: func(t *testing.T, p ContainerPlan) {
				if want := at(10*h + 40*time.Second); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v (c1 created + 1m)", p.NextEligible, want)
				}
			},
		},
		{
			// The deleted-pod sign: every sandbox stopped, nothing running,
			// its log dir gone for PodGrace, counted from the later of when
			// the dir was seen gone and the last sandbox's exit.
			name: "prune all: a pod is deleted only PodGrace after it is gone and stopped",
			evs: flat(
				// u1: dir gone 30s ago; grace 1m.
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"), exit(h, "s1"),
				// u2: dir gone long ago, sandbox stopped 10s ago.
				sandbox(0, "s2", "u2"), start(0, "s2"), criDead(0, m, "c2", "app:1", "u2", "app", "s2"), exit(10*h-10*time.Second, "s2"),
				// u3: dir gone, but its sandbox is ready.
				sandbox(0, "s3", "u3"), start(0, "s3"), criDead(0, m, "c3", "app:1", "u3", "app", "s3"),
				// u4: dir there, everything stopped (a completed Job pod).
				sandbox(0, "s4", "u4"), start(0, "s4"), criDead(0, m, "c4", "app:1", "u4", "app", "s4"), exit(h, "s4"),
			),
			gone: map[string]time.Duration{"u1": 10*h - 30*time.Second, "u2": h, "u3": h},
			mod:  func(p *ContainerPolicy) { p.PodGrace, p.Prune = m, PruneAll },
			keep: []string{"c1 within-cap", "c2 within-cap", "c3 within-cap", "c4 within-cap",
				"s1 pod-has-containers", "s2 pod-has-containers", "s3 running", "s4 pod-has-containers"},
			check: func(t *testing.T, p ContainerPlan) {
				// u4's log dir is looked at again in PodRecheck.
				if want := at(10*h + PodRecheck); !p.NextEligible.Equal(want) {
					t.Errorf("next eligible = %v, want %v", p.NextEligible, want)
				}
			},
		},
		{
			// A running pod without its log dir: the dir read is not the
			// kubelet's, so the stopped pod is not taken for deleted.
			name: "prune all: a running pod without a log dir makes the deleted-pod sign unreadable",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"), exit(h, "s1"),
				sandbox(0, "s2", "u2"), start(0, "s2"),
			),
			gone: map[string]time.Duration{"u1": h, "u2": h},
			mod:  func(p *ContainerPolicy) { p.PodGrace, p.Prune = m, PruneAll },
			keep: []string{"c1 within-cap", "s1 pod-has-containers", "s2 running"},
			check: func(t *testing.T, p ContainerPlan) {
				if !p.PodSignalBlind {
					t.Error("plan does not say the sign is unreadable")
				}
			},
		},
		{
			name: "prune all: the deleted pod of the case above, its grace over",
			evs: flat(
				sandbox(0, "s1", "u1"), start(0, "s1"), criDead(0, m, "c1", "app:1", "u1", "app", "s1"), exit(h, "s1"),
				sandbox(0, "s2", "u2"), start(0, "s2"), criDead(0, m, "c2", "app:1", "u2", "app", "s2"), exit(10*h-10*time.Second, "s2"),
			),
			now:    10*h + m,
			gone:   map[string]time.Duration{"u1": 10*h - 30*time.Second, "u2": h},
			mod:    func(p *ContainerPolicy) { p.PodGrace, p.Prune = m, PruneAll },
			remove: []string{"c1 pod-deleted", "c2 pod-deleted", "s1 pod-deleted", "s2 pod-deleted"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ContainerPolicy{MaxPerEvictUnit: 1, MaxContainers: -1, Prune: PruneNative}
			if tt.mod != nil {
				tt.mod(&p)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("test policy: %v", err)
			}
			s := build(tt.evs...)
			before := s.Clone()
			var gone PodLogDir
			if tt.gone != nil {
				gone = PodLogDirView{In: KnownInput(at(0)), GoneFn: func(uid, _, _ string) (time.Time, bool) {
					d, ok := tt.gone[uid]
					return at(d), ok
				}}
			}
			plan := planContainers(s, p, at(cmp.Or(tt.now, 10*h)), gone, true)

			if got := containerSummary(plan.Remove); !slices.Equal(got, tt.remove) {
				t.Errorf("remove:\n got %q\nwant %q", got, tt.remove)
			}
			if got := containerSummary(plan.Keep); !slices.Equal(got, tt.keep) {
				t.Errorf("keep:\n got %q\nwant %q", got, tt.keep)
			}
			checkContainerPlan(t, s, p, plan)
			// A GC pass's plan leaves settled containers out of Keep only.
			light := planContainers(s, p, plan.Now, gone, false)
			if !slices.Equal(containerSummary(light.Remove), containerSummary(plan.Remove)) || !light.NextEligible.Equal(plan.NextEligible) {
				t.Errorf("a pass's plan removes %q (next %v), the full plan %q (next %v)",
					containerSummary(light.Remove), light.NextEligible, containerSummary(plan.Remove), plan.NextEligible)
			}
			if !sameJSON(t, before, s) {
				t.Error("PlanContainers modified the state")
			}
			if tt.check != nil {
				tt.check(t, plan)
			}
		})
	}
}

// checkContainerPlan asserts what holds for every plan: each container
// appears once, nothing running or never started is removed, nothing the
// prune mode excludes is removed, no sandbox goes while a container in it
// stays, NextEligible is in the future.
func checkContainerPlan(t *testing.T, s *projection.State, p ContainerPolicy, plan ContainerPlan) {
	t.Helper()
	seen := map[string]int{}
	removed := map[string]bool{}
	for _, it := range plan.Remove {
		seen[it.ID]++
		removed[it.ID] = true
		c := s.Containers[it.ID]
		if !removes(it.Reason) {
			t.Errorf("remove %s with keep reason %q", it.ID, it.Reason)
		}
		if !c.Dead() && !(p.Prune == PruneAll && neverStartedCRI(c)) {
			t.Errorf("remove %s in state %s", it.ID, c.State)
		}
		if p.Prune == PruneOff || (p.Prune == PruneNative && c.CRIKind != "") {
			t.Errorf("remove %s (kind %q) under prune %s", it.ID, c.CRIKind, p.Prune)
		}
		if now := plan.Now; c.CRIKind != projection.KindSandbox && now.Sub(deadSince(c)) < p.MinAge {
			t.Errorf("remove %s dead for %s, min age %s", it.ID, now.Sub(deadSince(c)), p.MinAge)
		}
		if now := plan.Now; neverStartedCRI(c) && now.Sub(c.Created.Time()) < p.startGrace() {
			t.Errorf("remove %s created %s ago, never started, grace %s", it.ID, now.Sub(c.Created.Time()), p.startGrace())
		}
	}
	for _, it := range plan.Keep {
		seen[it.ID]++
		if removes(it.Reason) || it.Reason == "" {
			t.Errorf("keep %s with reason %q", it.ID, it.Reason)
		}
	}
	for id := range s.Containers {
		if seen[id] != 1 {
			t.Errorf("container %s appears %d times in the plan, want 1", id, seen[id])
		}
	}
	if len(seen) != len(s.Containers) {
		t.Errorf("plan has %d containers, state %d", len(seen), len(s.Containers))
	}
	for id := range removed {
		sb := s.Containers[id]
		if sb.CRIKind != projection.KindSandbox {
			continue
		}
		for _, c := range s.Containers {
			if c.CRIKind == projection.KindContainer && !removed[c.ID] && (c.SandboxID == sb.ID || (c.SandboxID == "" && sb.PodUID != "" && c.PodUID == sb.PodUID)) {
				t.Errorf("sandbox %s removed while its container %s stays", sb.ID, c.ID)
			}
		}
	}
	if !plan.NextEligible.IsZero() && !plan.NextEligible.After(plan.Now) {
		t.Errorf("next eligible %v is not after now %v", plan.NextEligible, plan.Now)
	}
	if plan.Remove == nil || plan.Keep == nil {
		t.Error("nil lists: JSON would say null, not []")
	}
}

func containerSummary(items []ContainerItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.ID+" "+string(it.Reason))
	}
	return out
}
