package logs

import (
	"io/fs"
	"strings"
	"syscall"
	"testing"
	"time"
)

// criVerified is the evidence of a pod log dir that holds the watched
// containerd's pods: the kubelet's rules apply.
var criVerified = Evidence{By: VerifiedByCRI, Detail: "test: verified by CRI"}

func TestPlanLogs(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace := time.Minute
	exited, running, unknown := cid("e1"), cid("a1"), cid("f1")
	long := strings.Repeat("p", maxNameLen-len("_ns_c-.log")-12) + "_ns_c-" + unknown[:12] + ".log" // truncated by the kubelet

	st := newFakeState()
	st.setContainer(exited, false)
	st.setContainer(running, true)
	st.setContainer(unknown[:12]+"x", false) // a different id sharing the prefix: exact match only
	st.setPod("alive", fakePod{alive: true})
	st.setPod("gone", fakePod{goneSince: now.Add(-2 * time.Minute)})
	st.setPod("young", fakePod{goneSince: now.Add(-10 * time.Second)})
	st.setPod("nosince", fakePod{})

	link := func(name string, target error) Entry {
		return Entry{Kind: KindSymlink, Name: name, Type: fs.ModeSymlink, TargetInView: true, TargetDirExists: true, TargetErr: target, FirstSeen: now}
	}
	pod := func(name string) Entry { // quiet for an hour
		return Entry{Kind: KindPodDir, Name: name, Type: fs.ModeDir, FirstSeen: now, Changed: now.Add(-time.Hour), Quiet: time.Hour}
	}
	dangling := syscall.ENOENT

	tests := []struct {
		name   string
		entry  Entry
		synced bool
		want   Decision
	}{
		{"not a .log name", link("web_ns_c-"+exited, dangling), true,
			Decision{Action: ActionKeep, Reason: ReasonNotLog}},
		{"regular .log file", Entry{Kind: KindSymlink, Name: "web_ns_c-" + exited + ".log"}, true,
			Decision{Action: ActionKeep, Reason: ReasonNotSymlink}},
		{"directory named .log", Entry{Kind: KindSymlink, Name: "d-" + exited + ".log", Type: fs.ModeDir}, true,
			Decision{Action: ActionKeep, Reason: ReasonNotSymlink}},
		{"target exists, container exited", link("web_ns_c-"+exited+".log", nil), true,
			Decision{Action: ActionKeep, Reason: ReasonTargetExists}},
		{"symlink loop is not dangling", link("web_ns_c-"+exited+".log", syscall.ELOOP), true,
			Decision{Action: ActionKeep, Reason: ReasonTargetError, Detail: syscall.ELOOP.Error()}},
		{"ENOTDIR is not dangling", link("web_ns_c-"+exited+".log", syscall.ENOTDIR), true,
			Decision{Action: ActionKeep, Reason: ReasonTargetError, Detail: syscall.ENOTDIR.Error()}},
		{"id shorter than 6", link("web_ns_c-abcde.log", dangling), true,
			Decision{Action: ActionKeep, Reason: ReasonBadName}},
		{"id with a non-alphanumeric byte", link("web_ns_c-abc\xffdef.log", dangling), true,
			Decision{Action: ActionKeep, Reason: ReasonBadName}},
		{"dangling, not synced", link("web_ns_c-"+exited+".log", dangling), false,
			Decision{Action: ActionKeep, Reason: ReasonNotSynced, Container: exited}},
		{"dangling, running (log rotation)", link("web_ns_c-"+running+".log", dangling), true,
			Decision{Action: ActionKeep, Reason: ReasonContainerRunning, Container: running}},
		{"dangling, exited", link("web_ns_c-"+exited+".log", dangling), true,
			Decision{Action: ActionRemove, Reason: ReasonContainerExited, Container: exited, EligibleAt: now}},
		{"dangling, exited, odd bytes and spaces in the pod part", link("my pod\xfe\xff_n s_c-"+exited+".log", dangling), true,
			Decision{Action: ActionRemove, Reason: ReasonContainerExited, Container: exited, EligibleAt: now}},
		{"dangling, unknown, just seen", link("web_ns_c-"+unknown+".log", dangling), true,
			Decision{Action: ActionWait, Reason: ReasonGrace, Container: unknown, EligibleAt: now.Add(grace)}},
		{"dangling, unknown, seen past the grace", func() Entry {
			e := link("web_ns_c-"+unknown+".log", dangling)
			e.FirstSeen = now.Add(-grace)
			return e
		}(), true, Decision{Action: ActionRemove, Reason: ReasonContainerUnknown, Container: unknown, EligibleAt: now}},
		{"dangling, unknown, just seen, made long ago (a restart, a first install)", func() Entry {
			e := link("web_ns_c-"+unknown+".log", dangling)
			e.Changed, e.Quiet = now.Add(-time.Hour), time.Hour
			return e
		}(), true, Decision{Action: ActionRemove, Reason: ReasonContainerUnknown, Container: unknown, EligibleAt: now.Add(grace - time.Hour)}},
		{"dangling, unknown, just seen, made just now", func() Entry {
			e := link("web_ns_c-"+unknown+".log", dangling)
			e.Changed, e.Quiet = now.Add(-time.Second), time.Second
			return e
		}(), true, Decision{Action: ActionWait, Reason: ReasonGrace, Container: unknown, EligibleAt: now.Add(grace - time.Second)}},
		{"dangling, unknown, truncated name", func() Entry {
			e := link(long, dangling)
			e.FirstSeen = now.Add(-time.Hour)
			return e
		}(), true, Decision{Action: ActionKeep, Reason: ReasonTruncatedName, Container: unknown[:12]}},

		{"pod: symlink to a directory", Entry{Kind: KindPodDir, Name: "ns_p_gone", Type: fs.ModeSymlink}, true,
			Decision{Action: ActionKeep, Reason: ReasonNotDirectory}},
		{"pod: regular file", Entry{Kind: KindPodDir, Name: "ns_p_gone"}, true,
			Decision{Action: ActionKeep, Reason: ReasonNotDirectory}},
		{"pod: lost+found", pod("lost+found"), true, Decision{Action: ActionKeep, Reason: ReasonBadName}},
		{"pod: empty uid", pod("ns_p_"), true, Decision{Action: ActionKeep, Reason: ReasonBadName}},
		{"pod: non-UTF-8 uid", pod("ns_p_go\xffne"), true, Decision{Action: ActionKeep, Reason: ReasonBadName}},
		{"pod: not synced", pod("ns_p_gone"), false,
			Decision{Action: ActionKeep, Reason: ReasonNotSynced, UID: "gone"}},
		{"pod: alive", pod("ns_p_alive"), true, Decision{Action: ActionKeep, Reason: ReasonPodAlive, UID: "alive"}},
		{"pod: alive and mounted", func() Entry { e := pod("ns_p_alive"); e.Mounted = true; return e }(), true,
			Decision{Action: ActionKeep, Reason: ReasonPodAlive, UID: "alive"}},
		{"pod: gone past grace", pod("ns_p_gone"), true,
			Decision{Action: ActionRemove, Reason: ReasonPodGone, UID: "gone", EligibleAt: now.Add(-time.Minute)}},
		{"pod: plain uid", pod("gone"), true,
			Decision{Action: ActionRemove, Reason: ReasonPodGone, UID: "gone", EligibleAt: now.Add(-time.Minute)}},
		{"pod: odd bytes and spaces before the uid", pod("n s_p\xff od_gone"), true,
			Decision{Action: ActionRemove, Reason: ReasonPodGone, UID: "gone", EligibleAt: now.Add(-time.Minute)}},
		{"pod: gone but a mount under it", func() Entry { e := pod("ns_p_gone"); e.Mounted = true; return e }(), true,
			Decision{Action: ActionKeep, Reason: ReasonMountPoint, UID: "gone"}},
		{"pod: gone within grace", pod("ns_p_young"), true,
			Decision{Action: ActionWait, Reason: ReasonGrace, UID: "young", EligibleAt: now.Add(50 * time.Second)}},
		{"pod: known, no gone time, counts from first seen", pod("ns_p_nosince"), true,
			Decision{Action: ActionWait, Reason: ReasonGrace, UID: "nosince", EligibleAt: now.Add(grace)}},
		{"pod: unknown, just seen, quiet for an hour", pod("ns_p_never"), true,
			Decision{Action: ActionRemove, Reason: ReasonPodUnknown, UID: "never", EligibleAt: now.Add(grace - time.Hour)}},
		{"pod: unknown, written 10s ago", func() Entry {
			e := pod("ns_p_never")
			e.Changed, e.Quiet = now.Add(-10*time.Second), 10*time.Second
			return e
		}(), true, Decision{Action: ActionWait, Reason: ReasonGrace, UID: "never", EligibleAt: now.Add(50 * time.Second)}},
		{"pod: unknown, changed ahead of the wall clock", func() Entry {
			e := pod("ns_p_never")
			e.Changed, e.Quiet = now.Add(time.Hour), -time.Hour
			return e
		}(), true, Decision{Action: ActionWait, Reason: ReasonGrace, UID: "never", EligibleAt: now.Add(grace)}},
		{"pod: gone past grace, written 10s ago", func() Entry {
			e := pod("ns_p_gone")
			e.Changed, e.Quiet = now.Add(-10*time.Second), 10*time.Second
			return e
		}(), true, Decision{Action: ActionWait, Reason: ReasonGrace, UID: "gone", EligibleAt: now.Add(50 * time.Second)}},
		{"pod: gone, its files' change time not read", func() Entry {
			e := pod("ns_p_gone")
			e.Changed, e.ChangedErr = time.Time{}, syscall.EACCES
			return e
		}(), true, Decision{Action: ActionKeep, Reason: ReasonChangeUnknown, UID: "gone", Detail: "when its files last changed is not known: " + syscall.EACCES.Error()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st.mu.Lock()
			st.synced = tc.synced
			st.mu.Unlock()
			p := PlanLogs([]Entry{tc.entry}, criVerified, st, grace, now)
			want := tc.want
			want.Kind, want.Name = tc.entry.Kind, tc.entry.Name
			if len(p.Decisions) != 1 || p.Decisions[0] != want {
				t.Fatalf("got %+v\nwant %+v", p.Decisions, want)
			}
			if want.Action == ActionWait && !p.Next.Equal(want.EligibleAt) {
				t.Errorf("Next = %v, want %v", p.Next, want.EligibleAt)
			}
			if want.Action != ActionWait && !p.Next.IsZero() {
				t.Errorf("Next = %v, want zero", p.Next)
			}
		})
	}
}

func TestPlanLogsNextIsEarliestAndSorted(t *testing.T) {
	now := time.Unix(1000, 0)
	st := newFakeState()
	st.setPod("young", fakePod{goneSince: now.Add(-50 * time.Second)})
	entries := []Entry{
		{Kind: KindPodDir, Name: "ns_b_never", Type: fs.ModeDir, FirstSeen: now, Changed: now.Add(-20 * time.Second), Quiet: 20 * time.Second},
		{Kind: KindSymlink, Name: "x_ns_c-" + cid("f") + ".log", Type: fs.ModeSymlink, TargetInView: true, TargetDirExists: true, TargetErr: syscall.ENOENT, FirstSeen: now.Add(-30 * time.Second)},
		{Kind: KindPodDir, Name: "ns_a_young", Type: fs.ModeDir, FirstSeen: now, Changed: now.Add(-time.Hour), Quiet: time.Hour},
	}
	p := PlanLogs(entries, criVerified, st, time.Minute, now)
	if want := now.Add(10 * time.Second); !p.Next.Equal(want) {
		t.Errorf("Next = %v, want %v", p.Next, want)
	}
	var names []string
	for _, d := range p.Decisions {
		names = append(names, string(d.Kind)+":"+d.Name)
	}
	want := []string{"poddir:ns_a_young", "poddir:ns_b_never", "symlink:x_ns_c-" + cid("f") + ".log"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("order = %v, want %v", names, want)
	}
}

func TestContainerIDAndPodUID(t *testing.T) {
	for _, tc := range []struct {
		name, id string
		ok       bool
	}{
		{"pod_ns_c-abcdef.log", "abcdef", true},
		{"pod_ns_my-container-0123456789ab.log", "0123456789ab", true},
		{"abcdef.log", "abcdef", true}, // no '-': the whole name is the last field, as in the kubelet
		{"pod_ns_c-abcde.log", "", false},
		{"pod_ns_c-abcdef.log.1", "", false},
		{"pod_ns_c-.log", "", false},
		{"pod_ns_c-abc.def.log", "", false},
	} {
		if id, ok := ContainerID(tc.name); id != tc.id || ok != tc.ok {
			t.Errorf("ContainerID(%q) = %q, %v; want %q, %v", tc.name, id, ok, tc.id, tc.ok)
		}
	}
	for _, tc := range []struct {
		name, uid string
		ok        bool
	}{
		{"ns_name_0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", "0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", true},
		{"0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", "0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", true},
		{"kube-system_etcd-node_5f4dcc3b5aa765d61d8327deb882cf99", "5f4dcc3b5aa765d61d8327deb882cf99", true},
		{"ns_name_", "", false},
		{"lost+found", "", false},
		{"ns_name_a b", "", false},
	} {
		if uid, ok := PodUID(tc.name); uid != tc.uid || ok != tc.ok {
			t.Errorf("PodUID(%q) = %q, %v; want %q, %v", tc.name, uid, ok, tc.uid, tc.ok)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"relative log dir":     func(c *Config) { c.LogDir = "var/log/containers" },
		"unclean pod log dir":  func(c *Config) { c.PodLogDir = "/var/log/pods/" },
		"same dirs":            func(c *Config) { c.PodLogDir = c.LogDir },
		"log dir in pod dir":   func(c *Config) { c.LogDir = "/var/log/pods/containers" },
		"pod dir in log dir":   func(c *Config) { c.LogDir = "/var/log" },
		"negative grace":       func(c *Config) { c.PodLogGrace = -time.Second },
		"root contains others": func(c *Config) { c.LogDir = "/" },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil, want an error", name)
		}
	}
	c := DefaultConfig()
	c.LogDir, c.PodLogDir = "/var/log/pods-links", "/var/log/pods"
	if err := c.Validate(); err != nil {
		t.Errorf("sibling dirs with a common prefix: %v", err)
	}
}

func TestParseMountinfo(t *testing.T) {
	data := []byte(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:1 /src /var/log/pods/ns_a_uid1/c/mnt rw shared:1 - ext4 /dev/sda1 rw
31 22 8:1 /src /var/log/pods/ns\040b_uid2 rw shared:1 - ext4 /dev/sda1 rw
32 22 8:1 /src /var/log/pods rw shared:1 - ext4 /dev/sda1 rw
33 22 8:1 /src /var/log/pods-other/x rw shared:1 - ext4 /dev/sda1 rw
34 22 8:1 /src /var/log/pods/back\134slash rw shared:1 - ext4 /dev/sda1 rw
`)
	got := parseMountinfo(data, "/var/log/pods")
	want := map[string]bool{"ns_a_uid1": true, "ns b_uid2": true, `back\slash`: true}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Errorf("missing %q in %v", k, got)
		}
	}
}

// TestPlanLogsBlindWithoutPodLogDir: with PodLogDir missing or empty while
// CRI containers run (a DaemonSet without that mount), every link would look
// dangling: none is removed. Without CRI containers, or with pod dirs seen,
// dangling links go as usual.
func TestPlanLogsBlindWithoutPodLogDir(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	exited := cid("e1")
	dangling := Entry{Kind: KindSymlink, Name: "p_ns_c-" + exited + ".log", Type: fs.ModeSymlink, TargetInView: true, TargetDirExists: true, TargetErr: syscall.ENOENT, FirstSeen: now}
	podDir := Entry{Kind: KindPodDir, Name: "ns_p_" + "alive", Type: fs.ModeDir, FirstSeen: now}
	elsewhere := dangling
	elsewhere.TargetInView = false
	for _, tt := range []struct {
		name       string
		criRunning bool
		entries    []Entry
		want       Reason
	}{
		{"no pod dirs, CRI containers run", true, []Entry{dangling}, ReasonNoPodLogDir},
		{"no pod dirs, CRI containers run, target elsewhere", true, []Entry{elsewhere}, ReasonNoPodLogDir},
		{"pod dirs seen, target elsewhere", true, []Entry{elsewhere, podDir}, ReasonTargetUnverifiable},
		{"no pod dirs, no CRI container runs", false, []Entry{dangling}, ReasonContainerExited},
		{"pod dirs seen, CRI containers run", true, []Entry{dangling, podDir}, ReasonContainerExited},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := newFakeState()
			st.criRunning = tt.criRunning
			st.setContainer(exited, false)
			st.setPod("alive", fakePod{alive: true})
			p := PlanLogs(tt.entries, criVerified, st, time.Minute, now)
			for _, d := range p.Decisions {
				if d.Kind == KindSymlink && d.Reason != tt.want {
					t.Errorf("link: %s %s, want reason %s", d.Action, d.Reason, tt.want)
				}
			}
		})
	}
}

// TestPlanLogsAsksRunningOnlyForALinkToRemove: whether CRI containers run
// reads every container of the projection, so a plan asks it only when a
// link would go, and once: not on every change of a node whose links are
// all kept.
func TestPlanLogsAsksRunningOnlyForALinkToRemove(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	running, exited := cid("r1"), cid("e1")
	link := func(id string) Entry {
		return Entry{Kind: KindSymlink, Name: "p_ns_c-" + id + ".log", Type: fs.ModeSymlink, TargetInView: true, TargetDirExists: true, TargetErr: syscall.ENOENT, FirstSeen: now}
	}
	st := newFakeState()
	st.criRunning = true
	st.setContainer(running, true)
	st.setContainer(exited, false)
	PlanLogs([]Entry{link(running), link(running)}, criVerified, st, time.Minute, now)
	if st.criAsked != 0 {
		t.Errorf("links all kept: asked %d times, want 0", st.criAsked)
	}
	p := PlanLogs([]Entry{link(exited), link(running), link(exited)}, criVerified, st, time.Minute, now)
	if st.criAsked != 1 {
		t.Errorf("two links to remove: asked %d times, want 1", st.criAsked)
	}
	for _, d := range p.Decisions {
		if d.Action == ActionRemove {
			t.Errorf("removed %s though CRI containers run without a pod log dir", d.Name)
		}
	}
}
