package projection

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/events"
)

// Apply folds one event into the state. It is deterministic and does no I/O;
// events about unknown objects are ignored, so duplicates and late events are
// harmless. A Listing must go through Reconcile instead.
func (s *State) Apply(ev events.Event) {
	s.Seq++
	switch e := ev.(type) {
	case events.ImageUpserted:
		s.noteReturn(e)
		s.upsertImage(e)
	case events.ImageDeleted:
		s.dropName(e.Name)
	case events.ContainerUpserted:
		s.upsertContainer(e)
	case events.ContainerDeleted:
		s.deleteContainer(e)
	case events.TaskStarted:
		c := s.Containers[e.ContainerID]
		// The daemon stamps starts and the shim stamps exits, so their order
		// is unreliable: the pid says which run an event belongs to. A start
		// of a process already seen exiting is late, not a new run.
		if c != nil && !(c.State == StateExited && e.Pid != 0 && c.Pid == e.Pid) {
			c.State, c.Pid, c.StartedAt = StateRunning, e.Pid, StampOf(e.At)
			c.ExitedAt, c.ExitStatus, c.CollectedAt = Stamp{}, 0, Stamp{}
			delete(s.dead, c.ID)
			c.op(e.At)
		}
	case events.TaskExited:
		s.taskExited(e)
	case events.Synced:
		s.Synced = true
	case events.ImageCollected:
		s.collected(e)
	case events.RegretReported:
		s.regretReported(e)
	}
}

func (s *State) upsertImage(e events.ImageUpserted) {
	if old, ok := s.Names[e.Name]; ok && old != e.Digest {
		s.dropName(e.Name)
	}
	img := s.Images[e.Digest]
	s.touch1(e.Digest)
	if img == nil {
		img = &Image{Digest: strings.Clone(e.Digest), FirstSeen: StampOf(e.At), Created: StampOf(e.Created)} // see interner: a copy of its own
		s.Images[img.Digest] = img
	}
	if (e.ConfigDigest != "" && e.ConfigDigest != img.ConfigDigest) || (e.ChainID != "" && e.ChainID != img.ChainID) {
		s.unindex(img)
		setShared(&img.ConfigDigest, cmp.Or(e.ConfigDigest, img.ConfigDigest), s.configDigest)
		setShared(&img.ChainID, cmp.Or(e.ChainID, img.ChainID), s.chainID)
		s.index(img)
	}
	if at := StampOf(e.At); s.ImageInUse(img) && at.After(img.LastUsed) {
		img.LastUsed = at // held by a container from the moment it appears
	}
	name := img.ConfigDigest // CRI names each image by its id: one string for both
	if e.Name != name {
		name = s.imageName(e.Name)
	}
	img.Names.set(name, events.ImageLabels(e.Labels))
	if e.Size > 0 {
		img.Size = e.Size
	}
	if created := StampOf(e.Created); img.Created.IsZero() || (!created.IsZero() && created.Before(img.Created)) {
		img.Created = created
	}
	s.Names[name] = img.Digest
}

func (s *State) dropName(name string) {
	digest, ok := s.Names[name]
	if !ok {
		return
	}
	delete(s.Names, name)
	s.touch1(digest)
	if img := s.Images[digest]; img != nil {
		img.Names.remove(name)
		if len(img.Names) == 0 {
			s.unindex(img)
			delete(s.Images, digest)
			return
		}
		// The earliest of its names' records may be the one gone: no
		// longer known (see pulledAgain), until a name is seen again.
		img.Created = Stamp{}
	}
}

func (s *State) upsertContainer(e events.ContainerUpserted) {
	c := s.Containers[e.ID]
	if c == nil {
		c = &Container{ID: strings.Clone(e.ID), FirstSeen: StampOf(e.At), State: StateCreated} // see interner: a copy of its own
		s.Containers[c.ID] = c
	}
	digest := e.ImageDigest
	if c.Image == e.Image && c.ImageDigest != "" {
		digest = c.ImageDigest // the content it was created from, even if the name moved since
	}
	if digest == "" {
		digest = s.Names[e.Image]
	}
	oldKeys := c.UseKeys()
	setShared(&c.ImageDigest, digest, s.imageDigest)
	// Content facts are sticky: a failed lookup does not forget them.
	setShared(&c.ImageID, cmp.Or(e.ImageID, c.ImageID), s.configDigest)
	setShared(&c.RootChain, cmp.Or(e.RootChain, c.RootChain), s.chainID)
	ids, chains := c.VolumeImageIDs(), c.VolumeChains()
	if e.VolumeImageIDs != nil || c.CRIKind != e.CRIKind {
		ids = sharedAll(e.VolumeImageIDs, s.configDigest)
	}
	if e.VolumeChains != nil {
		chains = sharedAll(e.VolumeChains, s.chainID)
	}
	c.setVolumes(ids, chains)
	c.RootKey = s.rootKey(c) // its digest is one of c's
	s.rekey(c.ID, oldKeys, c.UseKeys(), e.At)
	c.RestartManaged = e.RestartManaged
	c.op(e.At)
	wasSandbox := c.CRIKind == KindSandbox
	oldUID := c.PodUID
	setShared(&c.Image, e.Image, s.imageName)
	s.setInterned(&c.CRIKind, e.CRIKind)
	s.setInterned(&c.PodNamespace, e.PodNamespace)
	s.setInterned(&c.PodUID, e.PodUID)
	s.setInterned(&c.PodName, e.PodName)
	s.setInterned(&c.ContainerName, e.ContainerName)
	s.setInterned(&c.SandboxID, e.SandboxID)
	c.Created = keptCreated(c.Created, StampOf(e.Created))
	s.keepUnit(c)
	if wasSandbox && (oldUID != c.PodUID || c.CRIKind != KindSandbox) {
		s.leavePod(oldUID, c.ID, e.At)
	}
	if c.CRIKind == KindSandbox && c.PodUID != "" {
		p := s.Pods[c.PodUID]
		if p == nil {
			p = &Pod{UID: c.PodUID, Sandboxes: map[string]struct{}{}, FirstSeen: e.At}
			s.Pods[c.PodUID] = p
		}
		p.Name, p.Namespace, p.GoneAt = c.PodName, c.PodNamespace, time.Time{}
		if e.LogDir != "" && e.LogDir != p.LogDir {
			p.LogDir = strings.Clone(e.LogDir) // one pod's: nothing to share
		}
		p.Sandboxes[c.ID] = struct{}{}
	}
}

// keptCreated is the creation time an upsert of a container leaves it
// with, from the one it has and the one the event says: the earlier. A
// container's creation never moves later; a later time for the same
// container is a bound (containerd's stamp ahead of the agent's clock,
// bounded by each receipt and each listing's time), and taking it would
// give every container a listing bounds the same instant, erasing the
// creation order the caps keep the newest by. A container made again
// under its id is deleted first (events, Reconcile's madeAgain), so it
// starts afresh. An event without one keeps the one it has.
func keptCreated(have, said Stamp) Stamp {
	if said.IsZero() || !have.IsZero() && have.Before(said) {
		return have
	}
	return said
}

func (s *State) deleteContainer(e events.ContainerDeleted) {
	c := s.Containers[e.ID]
	if c == nil {
		return
	}
	delete(s.Containers, e.ID)
	delete(s.dead, e.ID)
	s.rekey(c.ID, c.UseKeys(), nil, e.At)
	if c.CRIKind == KindSandbox {
		s.leavePod(c.PodUID, c.ID, e.At)
	}
}

func (s *State) taskExited(e events.TaskExited) {
	c := s.Containers[e.ContainerID]
	if c == nil {
		return
	}
	if e.Amend && c.State == StateExited {
		c.ExitStatus = e.ExitStatus
		if e.Pid != 0 {
			c.Pid = e.Pid
		}
		if !e.ExitedAt.IsZero() {
			c.ExitedAt = StampOf(e.ExitedAt)
		}
		return
	}
	if e.Pid != 0 && c.Pid != 0 && e.Pid != c.Pid && c.State != StateCreated {
		return // an event of an earlier run
	}
	if e.Collected {
		c.op(e.At)
		if c.CollectedAt.IsZero() {
			c.CollectedAt = StampOf(e.At)
		}
	}
	if c.State == StateExited {
		return
	}
	exitedAt := e.ExitedAt
	if exitedAt.IsZero() {
		exitedAt = e.At
	}
	c.State, c.ExitedAt, c.ExitStatus = StateExited, StampOf(exitedAt), e.ExitStatus
	s.dead[c.ID] = c
	if e.Pid != 0 {
		c.Pid = e.Pid
	}
}

// rekey moves container id from the old use keys to the new ones, touching
// the images of every key that changed.
func (s *State) rekey(id string, old, now []UseKey, at time.Time) {
	for _, k := range old {
		if slices.Contains(now, k) {
			continue
		}
		s.users.remove(k, id)
		s.touch(k, at)
	}
	for _, k := range now {
		if slices.Contains(old, k) {
			continue
		}
		s.users.add(k, id)
		s.touch(k, at)
	}
}

// touch moves LastUsed of the images named by key forward only, so late
// events cannot rewind history.
func (s *State) touch(key UseKey, t time.Time) {
	at := StampOf(t)
	bump := func(img *Image) {
		if img == nil {
			return
		}
		s.touch1(img.Digest)
		if at.After(img.LastUsed) {
			img.LastUsed = at
		}
	}
	if key.kind == byTarget {
		bump(s.Images[key.v])
		return
	}
	s.byKey.each(key, func(d string) bool {
		bump(s.Images[d])
		return true
	})
}

// touch1 notes, for a tracer, that the image with this digest may have
// changed.
func (s *State) touch1(digest string) {
	if s.tracing {
		s.touched = append(s.touched, digest)
	}
}

func (s *State) leavePod(uid, id string, at time.Time) {
	p := s.Pods[uid]
	if p == nil {
		return
	}
	delete(p.Sandboxes, id)
	if len(p.Sandboxes) == 0 {
		p.GoneAt = at
	}
}

// keepUnit sets c's evictUnit: a plain container's is its id, a CRI
// container's is interned.
func (s *State) keepUnit(c *Container) {
	if u := c.unit(); u == c.ID {
		c.evictUnit = c.ID
	} else {
		s.setInterned(&c.evictUnit, u)
	}
}
