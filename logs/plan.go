package logs

import (
	"cmp"
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/schema"
)

// State is what the planner needs to know about the runtime. Implementations
// must be safe for concurrent use; the projection owner provides one.
type State interface {
	// Synced reports whether the projection has listed the runtime at least
	// once. Nothing is removed before it has.
	Synced() bool
	// ContainerState reports whether a container may still write its log
	// (running: true for any container whose task is not known to have
	// exited, created ones included, as the kubelet keeps the link of any
	// container that is not exited) and whether the container is known at
	// all. id is the id parsed from a link name: the full id, except for a
	// name the kubelet truncated to 255 bytes, where it may be a prefix.
	ContainerState(id string) (running, known bool)
	// PodState reports whether a sandbox of pod uid exists, since when the
	// last one is gone (zero while alive or unknown), and whether the uid is
	// known at all.
	PodState(uid string) (alive bool, goneSince time.Time, known bool)
	// CRIContainersRunning reports whether any CRI container (not a
	// sandbox) runs: their logs must then be under PodLogDir.
	CRIContainersRunning() bool
	// SandboxLogDirs returns the log directories CRI was given for the
	// pods whose sandbox exists (as CRI saw them: host paths), the
	// evidence that the pod log dir is the watched containerd's.
	SandboxLogDirs() []string
	// Containerd names the watched containerd (its introspection UUID,
	// which another daemon, or the same one after its root was wiped,
	// does not share); "" while not known. What the pod log dir showed
	// is kept for that containerd only (PodDirs).
	Containerd() string
}

// Kind names the rule that applies to an entry: KindSymlink for the entries
// of LogDir, KindPodDir for the entries of PodLogDir (schema.LogKind).
type Kind = schema.LogKind

// Entry kinds.
const (
	KindSymlink Kind = "symlink"
	KindPodDir  Kind = "poddir"
)

// Action is what the planner decided for an entry.
type Action string

// Actions. Wait is a keep with a deadline after which the entry is
// removable if nothing else changed.
const (
	ActionRemove Action = "remove"
	ActionKeep   Action = "keep"
	ActionWait   Action = "wait"
)

// Reason explains a decision; it is a metric label, so the set is closed
// (schema.Reason).
type Reason = schema.Reason

// Reasons to remove.
const (
	ReasonContainerExited  Reason = "container-exited"  // dangling link, container known and exited
	ReasonContainerUnknown Reason = "container-unknown" // dangling link, container unknown for the grace
	ReasonPodGone          Reason = "pod-gone"          // no sandbox of the uid for the grace
	ReasonPodUnknown       Reason = "pod-unknown"       // uid never known, dir seen for the grace
)

// Reasons to keep or wait.
const (
	ReasonNotLog           Reason = "not-log"           // LogDir entry not named *.log
	ReasonNotSymlink       Reason = "not-symlink"       // LogDir *.log entry that is not a symlink
	ReasonTargetExists     Reason = "target-exists"     // the link's target exists
	ReasonTargetError      Reason = "target-error"      // stat through the link failed, not with ENOENT (ELOOP, EACCES, ...)
	ReasonNotDirectory     Reason = "not-directory"     // PodLogDir entry that is not a directory (a symlink to one included)
	ReasonBadName          Reason = "bad-name"          // no valid container id or pod uid in the name
	ReasonNotSynced        Reason = "not-synced"        // projection not synced yet
	ReasonContainerRunning Reason = "container-running" // container not exited (log rotation window)
	ReasonTruncatedName    Reason = "truncated-name"    // unknown container but the id may be a prefix
	ReasonPodAlive         Reason = "pod-alive"         // a sandbox of the uid exists
	ReasonMountPoint       Reason = "mount-point"       // a mount point is at or under the pod dir
	ReasonGrace            Reason = "grace"             // removable at EligibleAt
	ReasonNoPodLogDir      Reason = "no-pod-log-dir"    // PodLogDir missing or empty while CRI containers run: every link would look dangling
	// ReasonTargetUnverifiable: the stat through the link failed, but its
	// target lies outside the pod log dir the agent sees
	// (Config.TargetInView): the file may exist on the host.
	ReasonTargetUnverifiable Reason = "target-unverifiable"
	// ReasonUnverified: a dangling link or an orphaned pod dir whose
	// removal needs evidence the pod log dir lacks (Evidence): that it is
	// where the kubelet writes (a missing target is gone), or that it
	// holds the watched containerd's pods (a container or pod that
	// containerd does not know is gone, not another containerd's).
	ReasonUnverified Reason = "pod-log-dir-unverified"
	// ReasonChangeUnknown: when anything below an orphaned pod dir last
	// changed could not be read (the walk failed): it may still be
	// written.
	ReasonChangeUnknown Reason = "change-unknown"
)

// InputReasons are the keep reasons that say an input of the decision is
// unknown or stale (the projection not synced, the pod log dir not
// verified, a target out of view, no pod log dir, the files' change times
// unread), not that the kubelet's rule keeps the entry: what the agent
// keeps that it could know is garbage once the input is known.
var InputReasons = []Reason{ReasonNotSynced, ReasonUnverified, ReasonTargetUnverifiable, ReasonNoPodLogDir, ReasonChangeUnknown}

// KeptForInputs counts the entries p keeps because an input is unknown
// or stale (InputReasons), by kind and reason; an empty map when none.
func (p Plan) KeptForInputs() map[Kind]map[Reason]int {
	out := map[Kind]map[Reason]int{}
	for _, d := range p.Decisions {
		if d.Action == ActionRemove || !slices.Contains(InputReasons, d.Reason) {
			continue
		}
		if out[d.Kind] == nil {
			out[d.Kind] = map[Reason]int{}
		}
		out[d.Kind][d.Reason]++
	}
	return out
}

// Entry is one scanned directory entry, the planner's whole view of it.
type Entry struct {
	Kind Kind
	// Name is the raw entry name (any bytes but '/' and NUL).
	Name string
	// Type holds the type bits of lstat: 0 for a regular file,
	// fs.ModeSymlink, fs.ModeDir, ...
	Type fs.FileMode
	// Target is, for a *.log symlink of LogDir, the link's target as read.
	Target string
	// TargetInView is whether Target lies in the pod log dir the agent
	// sees (Config.TargetInView): only then does a failed stat mean the
	// target is gone. False also when the target could not be read.
	TargetInView bool
	// TargetErr is, for a *.log symlink of LogDir, the error of stat of
	// the target where the agent sees it: nil when the target exists;
	// ENOENT means dangling if TargetInView and the pod log dir is where
	// the kubelet writes (Evidence), TargetDirExists or TargetPodDirGone.
	TargetErr error
	// TargetDirExists is, for a target not found, whether the directory
	// meant to hold it (below the pod log dir) exists: the file is gone
	// from a directory that is there.
	TargetDirExists bool
	// TargetPodDir is, for a target in view, the name of the pod dir it
	// lies in; TargetPodDirGone, for one not found, whether the agent saw
	// that dir and saw it go (PodDirs).
	TargetPodDir     string
	TargetPodDirGone bool
	// Changed is when the entry last changed by the filesystem's clock: a
	// link's mtime; for an orphaned pod dir the newest mtime at or below
	// it (zero: not read; ChangedErr says why, if the walk failed).
	// Quiet is how long before the pass that was, by the wall clock.
	Changed    time.Time
	ChangedErr error
	Quiet      time.Duration
	// Mounted is, for a pod dir, whether a mount point is at or under it.
	Mounted bool
	// FirstSeen is when the agent first saw the entry; the grace of objects
	// the projection does not know counts from it.
	FirstSeen time.Time
}

// Decision is the planner's verdict on one entry.
type Decision struct {
	Kind      Kind   `json:"kind"`
	Name      string `json:"name"` // relative to its directory; JSON replaces invalid UTF-8
	Action    Action `json:"action"`
	Reason    Reason `json:"reason"`
	Detail    string `json:"detail,omitempty"`
	Container string `json:"container,omitempty"`
	UID       string `json:"uid,omitempty"`
	// EligibleAt is when the entry became (or, waiting, becomes) removable.
	EligibleAt time.Time `json:"eligibleAt,omitzero"`
}

// Plan lists a decision for every scanned entry, sorted by kind and name.
type Plan struct {
	At        time.Time  `json:"at"`
	Synced    bool       `json:"synced"`
	DryRun    bool       `json:"dryRun"`
	Decisions []Decision `json:"decisions"`
	// Next is the earliest deadline of a waiting entry; zero if none.
	Next time.Time `json:"next,omitzero"`
	// PodLogDir is the pod log dir as an input: the evidence the plan
	// judged by.
	PodLogDir Evidence `json:"podLogDir"`
	// Problems says, one line each, why links are kept that the agent
	// cannot judge (Cleaner.Problems); set by the Cleaner, not PlanLogs.
	Problems []string `json:"problems,omitempty"`
}

// maxNameLen is the kubelet's ext4MaxFileNameLen: longer link names are
// truncated to it, cutting into the container id.
const maxNameLen = 255

// PlanLogs decides, for every entry, whether to remove it now, keep it or
// wait for a deadline, following the kubelet's rules (KUBELET-GC.md 2.4 and
// 2.5) where ev shows the pod log dir is the kubelet's and the watched
// containerd's, and keeping what it does not show. It does no I/O besides
// calling st.
func PlanLogs(entries []Entry, ev Evidence, st State, grace time.Duration, now time.Time) Plan {
	p := Plan{At: now, Synced: st.Synced(), PodLogDir: ev, Decisions: make([]Decision, 0, len(entries))}
	// A PodLogDir that is missing or empty while CRI containers run is not
	// the one the kubelet writes to (a DaemonSet without that mount, a
	// wrong flag): every link would look dangling. Remove no link then,
	// and say so also for a link kept as unverifiable: the missing dir is
	// the cause to fix first. Asked only for such links: it reads every
	// container.
	blind := sync.OnceValue(func() bool {
		return !slices.ContainsFunc(entries, func(e Entry) bool { return e.Kind == KindPodDir }) && st.CRIContainersRunning()
	})
	for _, e := range entries {
		d := decide(e, ev, st, grace, now)
		if e.Kind == KindSymlink && (d.Action != ActionKeep || d.Reason == ReasonTargetUnverifiable || d.Reason == ReasonUnverified) && blind() {
			d.Action, d.Reason, d.EligibleAt = ActionKeep, ReasonNoPodLogDir, time.Time{}
		}
		if d.Action == ActionWait && (p.Next.IsZero() || d.EligibleAt.Before(p.Next)) {
			p.Next = d.EligibleAt
		}
		p.Decisions = append(p.Decisions, d)
	}
	slices.SortFunc(p.Decisions, func(a, b Decision) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
	})
	return p
}

func decide(e Entry, ev Evidence, st State, grace time.Duration, now time.Time) Decision {
	if e.Kind == KindPodDir {
		return decidePodDir(e, ev, st, grace, now)
	}
	return decideLink(e, ev, st, grace, now)
}

func decideLink(e Entry, ev Evidence, st State, grace time.Duration, now time.Time) Decision {
	d := Decision{Kind: KindSymlink, Name: e.Name, Action: ActionKeep}
	switch {
	case !strings.HasSuffix(e.Name, ".log"):
		d.Reason = ReasonNotLog
		return d
	case e.Type != fs.ModeSymlink:
		d.Reason = ReasonNotSymlink
		return d
	case e.TargetErr == nil:
		d.Reason = ReasonTargetExists
		return d
	case !errors.Is(e.TargetErr, fs.ErrNotExist):
		// ELOOP, ENOTDIR, EACCES...: the kubelet's os.IsNotExist is false for
		// them too, so the link is not dangling.
		d.Reason, d.Detail = ReasonTargetError, e.TargetErr.Error()
		return d
	case !e.TargetInView:
		// The kubelet's stat sees the host's paths; this one does not.
		d.Reason, d.Detail = ReasonTargetUnverifiable, "target "+strconv.Quote(e.Target)+" lies outside the pod log dir the agent sees"
		d.Container, _ = ContainerID(e.Name)
		return d
	}
	id, ok := ContainerID(e.Name)
	if !ok {
		// The kubelet removes such a link anyway; it is not one of its links,
		// so it is not ours to remove.
		d.Reason = ReasonBadName
		return d
	}
	d.Container = id
	if !st.Synced() {
		d.Reason = ReasonNotSynced
		return d
	}
	running, known := st.ContainerState(id)
	switch {
	case running:
		d.Reason = ReasonContainerRunning
	case known && !ev.Kubelets() && !e.TargetDirExists && !e.TargetPodDirGone:
		// Absence is a sign only in a directory the kubelet writes to, or
		// where the agent saw the file's own directory.
		d.Reason, d.Detail = ReasonUnverified, "target "+strconv.Quote(e.Target)+" not found, but the pod log dir is not shown to be the kubelet's: "+ev.Detail
	case known:
		d.Action, d.Reason, d.EligibleAt = ActionRemove, ReasonContainerExited, now
	case !ev.Watched() && !e.TargetPodDirGone:
		// A container the watched containerd does not know may be another
		// containerd's, running (its log rotating): only a pod log dir of
		// the watched one's pods, or a pod dir seen going, says it is gone.
		d.Reason, d.Detail = ReasonUnverified, "container unknown to the watched containerd, and the pod log dir is not shown to be its: "+ev.Detail
	case len(e.Name) >= maxNameLen:
		d.Reason = ReasonTruncatedName
	default:
		// The grace counts from when the agent first saw the link, or from
		// when it was made, if that is earlier: an old link found after a
		// restart or on a first install goes at once.
		d.Reason = ReasonContainerUnknown
		deadline := e.FirstSeen.Add(grace)
		if !e.Changed.IsZero() {
			deadline = earliest(deadline, quietAt(e, grace, now))
		}
		waitOrRemove(&d, deadline, now)
	}
	return d
}

// quietAt is when e will have been quiet (not changed) for grace, on the
// clock of now: a change time ahead of the wall clock counts as now.
func quietAt(e Entry, grace time.Duration, now time.Time) time.Time {
	return now.Add(grace - max(e.Quiet, 0))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func decidePodDir(e Entry, ev Evidence, st State, grace time.Duration, now time.Time) Decision {
	d := Decision{Kind: KindPodDir, Name: e.Name, Action: ActionKeep}
	if e.Type != fs.ModeDir {
		d.Reason = ReasonNotDirectory
		return d
	}
	uid, ok := PodUID(e.Name)
	if !ok {
		d.Reason = ReasonBadName
		return d
	}
	d.UID = uid
	if !st.Synced() {
		d.Reason = ReasonNotSynced
		return d
	}
	alive, goneSince, known := st.PodState(uid)
	if alive {
		d.Reason = ReasonPodAlive
		return d
	}
	if e.Mounted {
		d.Reason = ReasonMountPoint
		return d
	}
	if !ev.Watched() {
		// The kubelet removes the dirs of pods it does not know; a pod the
		// watched containerd does not know is no sign of that unless the
		// pod log dir holds that containerd's pods.
		d.Reason, d.Detail = ReasonUnverified, "the pod log dir is not shown to hold the watched containerd's pods: "+ev.Detail
		return d
	}
	if e.ChangedErr != nil || e.Changed.IsZero() {
		d.Reason, d.Detail = ReasonChangeUnknown, "when its files last changed is not known"
		if e.ChangedErr != nil {
			d.Detail += ": " + e.ChangedErr.Error()
		}
		return d
	}
	// Never while anything below it was written within the grace; a pod
	// the projection knew goes the grace after its last sandbox, one it
	// never knew once quiet for the grace.
	deadline, reason := quietAt(e, grace, now), ReasonPodUnknown
	if known {
		since := e.FirstSeen
		if !goneSince.IsZero() {
			since = goneSince
		}
		deadline, reason = latest(deadline, since.Add(grace)), ReasonPodGone
	}
	d.Reason = reason
	waitOrRemove(&d, deadline, now)
	return d
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitOrRemove turns d into a removal at deadline, or a wait until it.
func waitOrRemove(d *Decision, deadline, now time.Time) {
	d.EligibleAt = deadline
	if now.Before(deadline) {
		d.Action, d.Reason = ActionWait, ReasonGrace
		return
	}
	d.Action = ActionRemove
}

// ContainerID parses the container id out of a kubelet log link name
// (<pod>_<namespace>_<container>-<id>.log): the last '-' field without
// ".log". It must be at least 6 characters (the kubelet's rule) of letters
// and digits only (runtime ids are hex); ok is false otherwise.
func ContainerID(name string) (id string, ok bool) {
	base, found := strings.CutSuffix(name, ".log")
	if !found {
		return "", false
	}
	id = base[strings.LastIndexByte(base, '-')+1:]
	if len(id) < 6 || !isToken(id, false) {
		return "", false
	}
	return id, true
}

// PodUID parses the pod uid out of a pod log dir name
// (<namespace>_<name>_<uid>, or a plain <uid>): the last '_' field. It must
// be letters, digits and '-' only (UUIDs, and hex hashes for static pods), so
// lost+found and the like are never taken for pods; ok is false otherwise.
func PodUID(name string) (uid string, ok bool) {
	uid = name[strings.LastIndexByte(name, '_')+1:]
	if uid == "" || !isToken(uid, true) {
		return "", false
	}
	return uid, true
}

func isToken(s string, dash bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || dash && c == '-') {
			return false
		}
	}
	return true
}
