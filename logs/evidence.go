package logs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Verified says what shows that the pod log dir is where the kubelet
// writes, and whose pods' logs it holds.
type Verified string

// What shows it, weakest first.
const (
	// Unverified: nothing does. It may be a directory the kubelet does not
	// write to (a wrong --pod-log-dir, a hostPath made empty), or the
	// pod log dir of another containerd's kubelet (k3s beside Docker's
	// containerd, a wrong --containerd-address): a missing file there is no
	// sign it is gone, a pod the watched containerd does not know no sign
	// that it was deleted.
	Unverified Verified = ""
	// VerifiedByLinks: a kubelet log link resolves into it (its target is
	// there): the kubelet writes there, so a file missing from it is gone.
	// Its containers are not known to the watched containerd: they may be
	// another's.
	VerifiedByLinks Verified = "links"
	// VerifiedByCRI: a log directory the watched CRI gave one of its
	// sandboxes is there, or a link of a container the watched containerd
	// knows resolves into it: it holds that containerd's pods' logs, so a
	// pod or container it does not know is gone (the kubelet's rule).
	VerifiedByCRI Verified = "cri"
)

// Evidence is the pod log dir as an input of the log planner: what shows
// it is the kubelet's and the watched containerd's, since when, and what
// it is (or why nothing does). The zero value shows nothing.
type Evidence struct {
	By Verified `json:"by,omitempty"`
	// Since is when this directory was first shown so (a restart keeps
	// it: PodDirs); zero when unverified.
	Since  time.Time `json:"since,omitzero"`
	Detail string    `json:"detail,omitempty"`
	// Containerd names the containerd it was shown for (State.Containerd):
	// kept, it holds for that one only.
	Containerd string `json:"containerd,omitempty"`
}

// Kubelets reports whether e shows the pod log dir is where the kubelet
// writes: a link's target missing from it is gone.
func (e Evidence) Kubelets() bool { return e.By == VerifiedByLinks || e.By == VerifiedByCRI }

// Watched reports whether e shows the pod log dir holds the watched
// containerd's pods' logs: a pod or container it does not know is gone.
func (e Evidence) Watched() bool { return e.By == VerifiedByCRI }

// judge returns what one pass's entries (both directories, the pod log
// dir read in full) and st show of the pod log dir now, and, when they
// show nothing and the watched CRI's sandboxes have log dirs none of which
// is here, says so in against: the watched containerd's pods write
// elsewhere, whatever was shown before. It does no I/O besides calling st.
func judge(cfg Config, entries []Entry, st State) (ev Evidence, against string) {
	dirs := map[string]bool{}
	for _, e := range entries {
		if e.Kind == KindPodDir && e.Type == fs.ModeDir {
			dirs[e.Name] = true
		}
	}
	elsewhere := ""
	for _, dir := range st.SandboxLogDirs() {
		base := filepath.Base(dir)
		if path, inView := cfg.TargetInView(dir); inView && filepath.Dir(path) != cfg.PodLogDir {
			// In view, but not one of the pod log dir's own entries.
		} else if dirs[base] && base != "." && base != "/" {
			return Evidence{By: VerifiedByCRI, Detail: "the watched CRI gave a sandbox the log dir " + strconv.Quote(dir) +
				", here as " + display(cfg.PodLogDir, base)}, ""
		}
		if elsewhere == "" {
			elsewhere = dir
		}
	}
	var live *Entry
	for i := range entries {
		e := &entries[i]
		if e.Kind != KindSymlink || e.Type != fs.ModeSymlink || !e.TargetInView || e.TargetErr != nil || !dirs[e.TargetPodDir] {
			continue
		}
		id, ok := ContainerID(e.Name)
		if !ok {
			continue
		}
		if _, known := st.ContainerState(id); known {
			return Evidence{By: VerifiedByCRI, Detail: "the log of container " + id + ", which the watched containerd knows, is here: " +
				display(cfg.LogDir, e.Name) + " -> " + strconv.Quote(e.Target)}, ""
		}
		if live == nil {
			live = e
		}
	}
	if elsewhere != "" {
		against = "the watched CRI gives its sandboxes log dirs elsewhere, e.g. " + strconv.Quote(elsewhere) +
			", none of them in --pod-log-dir " + cfg.PodLogDir
	}
	if live != nil {
		return Evidence{By: VerifiedByLinks, Detail: "the kubelet's link " + display(cfg.LogDir, live.Name) + " resolves into it (" +
			strconv.Quote(live.Target) + "), but no pod of the watched containerd has its logs here"}, against
	}
	return Evidence{Detail: "no sandbox of the watched CRI has its log dir here, and no kubelet link resolves into it"}, against
}

// evidence is what the pod log dir shows in this pass (read says whether
// its full read succeeded), combined with what dirs kept of earlier ones
// for the same directory and the same containerd; what is newly shown is
// recorded in dirs (saved with it), once the projection has listed that
// containerd: before, its pods are the journal's, maybe another
// containerd's. A read that failed shows nothing; evidence against (the
// watched CRI's pods write elsewhere) outweighs what was shown before.
func (c *Cleaner) evidence(dirs *PodDirs, entries []Entry, read bool, now time.Time, save bool) Evidence {
	if !read {
		return Evidence{Detail: "the pod log dir was not read"}
	}
	id := c.state.Containerd()
	cur, against := judge(c.cfg, entries, c.state)
	saved, other := dirs.evidence(id)
	if save && other != nil && *other != c.otherSaid {
		c.otherSaid = *other
		c.log.Warn().Str("path", c.cfg.PodLogDir).Str("verified_by", string(other.By)).Str("verified_for", cmp.Or(other.Containerd, "unknown")).
			Str("containerd", cmp.Or(id, "unknown")).
			Msg("the pod log dir was shown to be the kubelet's for another containerd than the one watched now: that says nothing of this one's pods")
	}
	verify := func(ev Evidence) Evidence {
		if !c.state.Synced() {
			return ev // the journal's pods, not yet the containerd's: not kept
		}
		return dirs.verify(ev, id, now)
	}
	switch {
	case cur.Watched():
		return verify(cur)
	case against != "":
		return Evidence{Detail: against}
	case saved.Watched():
		return saved
	case cur.Kubelets():
		return verify(cur)
	case saved.Kubelets():
		return saved
	}
	return cur
}

// sayEvidence logs one line when what the pod log dir shows changes: at
// info when it is verified, at warn when entries are kept because it is
// not. The caller holds c.mu.
func (c *Cleaner) sayEvidence(p Plan) {
	kept := p.KeptForInputs()
	n := kept[KindSymlink][ReasonUnverified] + kept[KindPodDir][ReasonUnverified]
	said := p.PodLogDir.By
	if said == Unverified && n == 0 {
		said = "-" // nothing kept for it: nothing to say
	}
	if said == c.evidenceSaid {
		return
	}
	first := c.evidenceSaid == ""
	c.evidenceSaid = said
	switch {
	case p.PodLogDir.By != Unverified:
		c.log.Info().Str("path", c.cfg.PodLogDir).Str("verified_by", string(p.PodLogDir.By)).Str("detail", p.PodLogDir.Detail).
			Msg("pod log dir verified")
	case n > 0:
		c.log.Warn().Str("path", c.cfg.PodLogDir).Int("links", kept[KindSymlink][ReasonUnverified]).
			Int("pod_dirs", kept[KindPodDir][ReasonUnverified]).Str("reason", string(ReasonUnverified)).Str("detail", p.PodLogDir.Detail).
			Msg("dangling log links and orphaned pod log dirs kept: the pod log dir is not shown to be the watched containerd's")
	case !first:
		c.log.Info().Str("path", c.cfg.PodLogDir).Str("detail", p.PodLogDir.Detail).Msg("pod log dir not verified any more")
	}
}

// age reads, for each pod dir of entries the plan may remove (a directory
// of a pod without a sandbox, in a pod log dir that holds the watched
// containerd's pods), when anything at or below it last changed: only
// those are walked, not every live pod's dir on every pass. root is the
// pod log dir's fd.
func (c *Cleaner) age(root int, entries []Entry, ev Evidence) {
	if !ev.Watched() || !c.state.Synced() {
		return
	}
	for i := range entries {
		e := &entries[i]
		if e.Kind != KindPodDir || e.Type != fs.ModeDir || e.Mounted {
			continue
		}
		uid, ok := PodUID(e.Name)
		if !ok {
			continue
		}
		if alive, _, _ := c.state.PodState(uid); alive {
			continue
		}
		e.Changed, e.ChangedErr = podDirChanged(root, c.cfg.PodLogDir, e.Name)
		if errors.Is(e.ChangedErr, errMount) {
			e.Mounted, e.ChangedErr = true, nil
		}
	}
}

// quiet sets each entry's Quiet from its Changed and the wall clock.
func quiet(entries []Entry, wall time.Time) {
	for i := range entries {
		if !entries[i].Changed.IsZero() {
			entries[i].Quiet = wall.Sub(entries[i].Changed)
		}
	}
}

// mtime is the modification time of a stat.
func mtime(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec) }

// unverifiedProblem words what p keeps because the pod log dir is not
// verified; "" when nothing.
func (c *Cleaner) unverifiedProblem(p Plan) string {
	kept := p.KeptForInputs()
	links, dirs := kept[KindSymlink][ReasonUnverified], kept[KindPodDir][ReasonUnverified]
	if links+dirs == 0 {
		return ""
	}
	return fmt.Sprintf("%d dangling log links and %d orphaned pod log dirs kept (%s): --pod-log-dir %s is not shown to hold the watched containerd's pods: %s",
		links, dirs, ReasonUnverified, c.cfg.PodLogDir, p.PodLogDir.Detail)
}
