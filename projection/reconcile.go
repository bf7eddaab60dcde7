package projection

import (
	"maps"
	"slices"
	"time"

	"github.com/gcagent/gcagent/events"
)

// Reconcile returns the events that bring s up to what the listing shows,
// ending with Synced. It is pure: apply the result to s with Apply. Events are
// stamped with the listing's time and sorted, so the journal is deterministic.
// Times the agent already knows (first seen, last used, exit times) are kept.
func Reconcile(s *State, l events.Listing) []events.Event {
	var out []events.Event

	// An image pulled again while the agent was away is a new one to the
	// node: its old record goes first (every name of it), so that the
	// upserts below make a new one, first seen now.
	again := pulledAgain(s, l.Images)
	dropped := map[string]struct{}{}
	for _, d := range again {
		for _, n := range s.Images[d].Names {
			dropped[n.Name] = struct{}{}
			out = append(out, events.ImageDeleted{At: l.At, Name: n.Name})
		}
	}

	// The listing is walked in sorted order through indexes: a busy node's
	// listing is megabytes, and a sorted copy of it is garbage at once.
	listedNames := make(map[string]struct{}, len(l.Images)+len(dropped))
	for _, i := range sortedBy(len(l.Images), func(i int) string { return l.Images[i].Name }) {
		li := l.Images[i]
		listedNames[li.Name] = struct{}{}
		if _, drop := dropped[li.Name]; !drop && !slices.Contains(again, li.Digest) && imageCurrent(s, li) {
			continue
		}
		li.At = l.At
		out = append(out, li)
	}
	maps.Copy(listedNames, dropped)
	for _, name := range unlisted(s.Names, listedNames) {
		out = append(out, events.ImageDeleted{At: l.At, Name: name})
	}

	tasks := make(map[string]events.Task, len(l.Tasks))
	for _, t := range l.Tasks {
		tasks[t.ContainerID] = t
	}
	listed := make(map[string]struct{}, len(l.Containers))
	for _, i := range sortedBy(len(l.Containers), func(i int) string { return l.Containers[i].ID }) {
		lc := l.Containers[i]
		listed[lc.ID] = struct{}{}
		have := s.Containers[lc.ID]
		if have != nil && madeAgain(have, lc, l.At) {
			// Another container under its id: the one the projection
			// knows went while the agent was away.
			out = append(out, events.ContainerDeleted{At: l.At, ID: lc.ID})
			have = nil
		}
		if !containerCurrent(have, lc) || lc.LogDir != "" && podLogDir(s, lc.PodUID) != lc.LogDir {
			lc.At = l.At
			out = append(out, lc)
		}
		state := StateCreated
		if have != nil {
			state = have.State
		}
		t, hasTask := tasks[lc.ID]
		switch {
		case hasTask && (t.Status == events.TaskRunning || t.Status == events.TaskPaused):
			if state != StateRunning {
				out = append(out, events.TaskStarted{At: l.At, ContainerID: lc.ID, Pid: t.Pid})
			}
		case hasTask && t.Status == events.TaskStopped:
			switch {
			case state != StateExited:
				out = append(out, events.TaskExited{At: l.At, ContainerID: lc.ID, Pid: t.Pid, ExitStatus: t.ExitStatus,
					ExitedAt: exitedSince(have, t.ExitedAt, l.At)})
			case t.ExitStatus != have.ExitStatus || t.Pid != 0 && have.Pid != 0 && t.Pid != have.Pid:
				// The exit the projection holds is not the one containerd
				// or CRI reports: guessed when the task went away unseen,
				// or of a run before the one that exited while the agent
				// was away. The listing's is the truth.
				out = append(out, events.TaskExited{At: l.At, ContainerID: lc.ID, Pid: t.Pid, ExitStatus: t.ExitStatus,
					ExitedAt: t.ExitedAt, Amend: true})
			}
		case hasTask:
			// A task of unknown status (CRI could not tell yet): the state
			// is kept, never guessed; another listing follows.
		case state == StateRunning:
			// The task went away while we were not listening: the exit time is
			// unknown, so the listing's time is the best bound we have.
			out = append(out, events.TaskExited{At: l.At, ContainerID: lc.ID, ExitedAt: l.At, Collected: true})
		case state == StateExited && have.CollectedAt.IsZero():
			// Its task was deleted while we were not listening: collected.
			out = append(out, events.TaskExited{At: l.At, ContainerID: lc.ID, Pid: have.Pid,
				ExitStatus: have.ExitStatus, ExitedAt: have.ExitedAt.Time(), Collected: true})
		}
	}
	for _, id := range unlisted(s.Containers, listed) {
		out = append(out, events.ContainerDeleted{At: l.At, ID: id})
	}
	return append(out, events.Synced{At: l.At})
}

// exitedSince is the exit time a listing (at at) reports for a container
// the projection holds not exited. The container exited after the agent
// first saw it and after it saw it start: a stamp before either was made
// by a host clock behind the agent's (stepped back, and the agent
// restarted before it saw the exit), and says nothing of when the exit
// was. Then the listing's own time stands for it: the latest the exit
// can have been, which keeps the container the longer (fail closed).
func exitedSince(have *Container, exited, at time.Time) time.Time {
	if have == nil || exited.IsZero() {
		return exited
	}
	for _, t := range []Stamp{have.FirstSeen, have.StartedAt} {
		if !t.IsZero() && t.Time().After(exited) {
			return at
		}
	}
	return exited
}

// madeAgain reports whether the listed container l (listed at at) is
// another one than c, made under its id while the agent was not
// listening (deleted and created again: ctr, a script reusing its ids).
// It says so only when both creation times are containerd's own, not
// bounded by the agent's time of receipt (which a wall clock ahead of
// the agent's makes them): then they differ. Otherwise it cannot tell,
// and c stays (as before).
func madeAgain(c *Container, l events.ContainerUpserted, at time.Time) bool {
	created := StampOf(l.Created)
	return c.Created.Before(c.FirstSeen) && created.Before(StampOf(at)) && !created.IsZero() && created != c.Created
}

// pulledAgain returns, sorted, the digests of the projection's images
// listed with the very names the projection knows, every one a record
// made after the earliest it knows (containerd's creation times, never
// the agent's clock): each was deleted and pulled again while the agent
// was not listening. A name added or gone meanwhile says nothing of the
// others: such an image is left as it is. (Re-creating only its earliest
// name while away looks the same: its first-seen time moves to now,
// which keeps it the longer.)
func pulledAgain(s *State, listed []events.ImageUpserted) []string {
	type seen struct {
		earliest Stamp // zero: a name without a creation time
		names    int
	}
	by := map[string]*seen{}
	for _, li := range listed {
		img := s.Images[li.Digest]
		if img == nil || img.Created.IsZero() {
			continue
		}
		if _, known := img.Names.find(li.Name); !known {
			by[li.Digest] = &seen{} // a name the projection does not know: not the same names
			continue
		}
		sn := by[li.Digest]
		if sn == nil {
			sn = &seen{earliest: StampOf(li.Created)}
			by[li.Digest] = sn
		} else if c := StampOf(li.Created); c.Before(sn.earliest) {
			sn.earliest = c
		}
		if !sn.earliest.IsZero() {
			sn.names++
		}
	}
	var out []string
	for d, sn := range by {
		if !sn.earliest.IsZero() && sn.names == len(s.Images[d].Names) && sn.earliest.After(s.Images[d].Created) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// unlisted returns the keys of have that listed lacks, sorted: usually a
// few of tens of thousands, so only they are sorted.
func unlisted[V any](have map[string]V, listed map[string]struct{}) []string {
	var out []string
	for k := range have {
		if _, ok := listed[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func imageCurrent(s *State, li events.ImageUpserted) bool {
	digest, ok := s.Names[li.Name]
	if !ok || digest != li.Digest {
		return false
	}
	img := s.Images[digest]
	if img == nil {
		return false
	}
	labels, _ := img.Names.Labels(li.Name)
	return maps.Equal(labels, li.Labels) && (li.Size == 0 || img.Size == li.Size) &&
		(li.ConfigDigest == "" || img.ConfigDigest == li.ConfigDigest) && (li.ChainID == "" || img.ChainID == li.ChainID)
}

// containerCurrent compares what a listing can tell. The digest is compared
// only when the state has none: the state keeps the content a container was
// created from even after its image name moved.
func containerCurrent(c *Container, l events.ContainerUpserted) bool {
	return c != nil && c.Image == l.Image && (c.ImageDigest != "" || l.ImageDigest == "") &&
		c.CRIKind == l.CRIKind && c.PodUID == l.PodUID && c.PodName == l.PodName &&
		c.PodNamespace == l.PodNamespace && c.ContainerName == l.ContainerName &&
		c.SandboxID == l.SandboxID && keptCreated(c.Created, StampOf(l.Created)) == c.Created &&
		(l.ImageID == "" || c.ImageID == l.ImageID) && (l.RootChain == "" || c.RootChain == l.RootChain) &&
		slices.Equal(c.VolumeImageIDs(), l.VolumeImageIDs) && (l.VolumeChains == nil || slices.Equal(c.VolumeChains(), l.VolumeChains)) &&
		c.RestartManaged == l.RestartManaged
}

// podLogDir is the log dir the projection holds of pod uid ("" none): a
// sandbox listed with another (one restored from a snapshot of format 3,
// which had none) is upserted again.
func podLogDir(s *State, uid string) string {
	if p := s.Pods[uid]; p != nil {
		return p.LogDir
	}
	return ""
}

// sortedBy returns the indexes 0..n-1 in the order of key(index).
func sortedBy(n int, key func(i int) string) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmpString(key(a), key(b)) })
	return order
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Clone returns a deep copy, for readers outside the owner's lock.
func (s *State) Clone() *State {
	c := &State{
		Images:     make(map[string]*Image, len(s.Images)),
		Names:      maps.Clone(s.Names),
		Containers: make(map[string]*Container, len(s.Containers)),
		Pods:       make(map[string]*Pod, len(s.Pods)),
		users:      s.users.clone(),
		Synced:     s.Synced,
		Seq:        s.Seq,
		Namespace:  s.Namespace,
	}
	for k, img := range s.Images {
		cp := *img
		cp.Names = slices.Clone(img.Names)
		for i, n := range cp.Names {
			cp.Names[i].Labels = maps.Clone(n.Labels)
		}
		c.Images[k] = &cp
	}
	for k, ct := range s.Containers {
		cp := *ct
		cp.setVolumes(slices.Clone(ct.VolumeImageIDs()), slices.Clone(ct.VolumeChains()))
		c.Containers[k] = &cp
	}
	for k, p := range s.Pods {
		cp := *p
		cp.Sandboxes = maps.Clone(p.Sandboxes)
		c.Pods[k] = &cp
	}
	c.Deletions = make(map[string]*Deletion, len(s.Deletions))
	for k, d := range s.Deletions {
		cp := *d
		cp.Names = slices.Clone(d.Names)
		c.Deletions[k] = &cp
	}
	if c.Names == nil {
		c.Names = map[string]string{}
	}
	c.reindex()
	return c
}
