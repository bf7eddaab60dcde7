// Package projection holds the agent's live picture of one containerd
// namespace: which image is used by which container and when it was last
// used, which containers are dead, which pods are alive.
//
// State.Apply is the reducer: deterministic, no I/O, no locks, time taken
// only from the event, so replaying the journal rebuilds the exact state.
// Live owns a State, feeds it, persists it through a Store, and hands out
// copies.
package projection

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/events"
)

// CRI labels and values gcagent reads (copied: containerd's are internal).
const (
	LabelPinned      = events.LabelPinned
	LabelPinnedValue = "pinned"
	LabelCRIManaged  = events.LabelCRIManaged
	KindSandbox      = "sandbox"
	KindContainer    = "container"
)

// ContainerState is what the agent knows of a container's init process.
// One byte in the record (a busy node holds tens of thousands); its text,
// in JSON and snapshots, is its name.
type ContainerState uint8

// Container states. Created means no task was ever seen: CRI creates
// containers before it starts them, so such a container is not dead. The
// zero state, "", is none of them.
const (
	StateCreated ContainerState = iota + 1
	StateRunning
	StateExited
)

var stateNames = [...]string{"", "created", "running", "exited"}

func (st ContainerState) String() string {
	if int(st) < len(stateNames) {
		return stateNames[st]
	}
	return fmt.Sprintf("state(%d)", uint8(st))
}

// MarshalText writes the state's name: the text it had when it was a string.
func (st ContainerState) MarshalText() ([]byte, error) {
	if int(st) >= len(stateNames) {
		return nil, fmt.Errorf("container state %d", uint8(st))
	}
	return []byte(stateNames[st]), nil
}

// UnmarshalText reads a state's name; an unknown one is an error.
func (st *ContainerState) UnmarshalText(b []byte) error {
	v, ok := parseState(string(b))
	if !ok {
		return fmt.Errorf("unknown container state %q", b)
	}
	*st = v
	return nil
}

func parseState(name string) (ContainerState, bool) {
	i := slices.Index(stateNames[:], name)
	return ContainerState(i), i >= 0
}

// State is the projection. Fields are exported for persistence and for
// read-only use by planners; mutate only through Apply.
type State struct {
	Images     map[string]*Image     `json:"images"`     // by target digest
	Names      map[string]string     `json:"-"`          // image name -> target digest; derived from Images (fill)
	Containers map[string]*Container `json:"containers"` // by id
	Pods       map[string]*Pod       `json:"pods"`       // by pod uid
	// users indexes containers by the use keys they hold (see
	// Container.UseKeys), also for keys no image has (any more, or yet).
	// Derived from Containers (fill rebuilds it), so never persisted: a
	// snapshot decodes faster without it. Each set is sorted (see
	// keySets): nearly every key has one user.
	users  keySets
	Synced bool   `json:"synced"`
	Seq    uint64 `json:"seq"` // events applied so far
	// Namespace is the containerd namespace this projection is of; set by
	// its Live (a state restored from a file written before namespaces
	// were managed has none stored).
	Namespace string `json:"namespace,omitempty"`

	// byKey maps config and chain use keys to the digests of the images
	// they name, sorted. It is derived from Images (reindex), never
	// persisted.
	byKey keySets
	// strs interns the strings the records hold (see interner); never
	// persisted or cloned.
	strs interner
	// dead holds the containers whose task exited (Dead), so that a
	// container GC pass looks at those, not at every container of a busy
	// node on every change. Derived (reindex), never persisted.
	dead map[string]*Container
}

// Image is one target digest with all the names that point at it.
type Image struct {
	Digest    string     `json:"digest"`
	Names     ImageNames `json:"names"`
	Size      int64      `json:"size"`
	Created   Stamp      `json:"created,omitzero"`
	FirstSeen Stamp      `json:"firstSeen"`
	// LastUsed is when a container last started or stopped referencing the
	// image; while any does, the image counts as used now (see State.LastUsed).
	LastUsed Stamp `json:"lastUsed"`
	// ConfigDigest (the CRI image id) and ChainID (of the top layer) say
	// what content the image is, so containers are matched to it by what
	// they run, not by a name that may have moved.
	ConfigDigest string `json:"configDigest,omitempty"`
	ChainID      string `json:"chainID,omitempty"`
}

// Container is one container of the namespace. A busy node holds tens of
// thousands: the fields are laid out to fit the allocator's 288-byte class
// (TestContainerRecordSize).
type Container struct {
	ID            string         `json:"id"`
	Image         string         `json:"image"`
	ImageDigest   string         `json:"imageDigest"`
	CRIKind       string         `json:"criKind,omitempty"`
	PodUID        string         `json:"podUID,omitempty"`
	PodName       string         `json:"podName,omitempty"`
	PodNamespace  string         `json:"podNamespace,omitempty"`
	ContainerName string         `json:"containerName,omitempty"`
	SandboxID     string         `json:"sandboxID,omitempty"`
	Created       Stamp          `json:"created,omitzero"`
	FirstSeen     Stamp          `json:"firstSeen"`
	StartedAt     Stamp          `json:"startedAt,omitzero"`
	ExitedAt      Stamp          `json:"exitedAt,omitzero"`
	Pid           uint32         `json:"pid,omitempty"` // of the current or last run
	ExitStatus    uint32         `json:"exitStatus"`
	State         ContainerState `json:"state"`
	// RestartManaged: a restart policy wants it running.
	RestartManaged bool `json:"restartManaged,omitempty"`
	// What the container runs, by content (see events.ContainerUpserted);
	// its image volumes are VolumeImageIDs and VolumeChains.
	ImageID   string `json:"imageID,omitempty"`
	RootChain string `json:"rootChain,omitempty"`
	vols      *imageVolumes
	// RootKey is the use key of the image the rootfs runs, chosen when the
	// container is upserted (see rootKey).
	RootKey UseKey `json:"rootKey,omitzero"`
	// CollectedAt is when the task of the last run was deleted, by its
	// client or CRI: the owner has its exit status. Zero while not.
	CollectedAt Stamp `json:"collectedAt,omitzero"`
	// LastOpAt is the time of the last client operation seen on it
	// (create, update, task start, task delete).
	LastOpAt Stamp `json:"lastOpAt,omitzero"`

	// evictUnit is EvictUnit, kept (interned: every restart of a pod's
	// container shares it) because each container GC plan reads it.
	evictUnit string
}

// imageVolumes are the image volumes a container mounts, behind a pointer
// that is nil for the many that mount none (8 bytes instead of two slices'
// 48 in every record).
type imageVolumes struct {
	imageIDs, chains []string
}

// VolumeImageIDs are the config digests (CRI image ids) of the images c
// mounts as volumes; read-only.
func (c *Container) VolumeImageIDs() []string {
	if c.vols == nil {
		return nil
	}
	return c.vols.imageIDs
}

// VolumeChains are the chain ids of the image volumes c's snapshots hold
// (a sandbox's leased volumes); read-only.
func (c *Container) VolumeChains() []string {
	if c.vols == nil {
		return nil
	}
	return c.vols.chains
}

// setVolumes sets c's image volumes; none leaves no record of them.
func (c *Container) setVolumes(imageIDs, chains []string) {
	if len(imageIDs) == 0 && len(chains) == 0 {
		c.vols = nil
		return
	}
	c.vols = &imageVolumes{imageIDs, chains}
}

// containerJSON is a Container as JSON (snapshots before the binary
// format), with its image volumes as the fields they were.
type containerJSON struct {
	*containerFields
	VolumeImageIDs []string `json:"volumeImageIDs,omitempty"`
	VolumeChains   []string `json:"volumeChains,omitempty"`
}

type containerFields Container // without Container's methods

// MarshalJSON is on the value, so that a Container held by value writes its
// volumes too.
func (c Container) MarshalJSON() ([]byte, error) {
	return json.Marshal(containerJSON{(*containerFields)(&c), c.VolumeImageIDs(), c.VolumeChains()})
}

func (c *Container) UnmarshalJSON(b []byte) error {
	v := containerJSON{containerFields: (*containerFields)(c)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.setVolumes(v.VolumeImageIDs, v.VolumeChains)
	return nil
}

// UseKeys returns the keys by which c holds images: its RootKey, plus its
// image volumes. An image is in use when any of its keys is held.
func (c *Container) UseKeys() []UseKey {
	var keys []UseKey
	if !c.RootKey.IsZero() {
		keys = append(keys, c.RootKey)
	}
	for _, v := range c.VolumeImageIDs() {
		keys = append(keys, configKey(v))
	}
	for _, v := range c.VolumeChains() {
		keys = append(keys, chainKey(v))
	}
	return keys
}

// rootKey picks the key of the image c's rootfs runs: CRI's image id
// (exact); else the target its name resolved to when that image's top layer
// is the rootfs snapshot's parent (the name still says what it runs); else,
// when the name moved or is unknown, the parent chain itself, which holds
// every image with that top layer; else the name's target.
func (s *State) rootKey(c *Container) UseKey {
	switch {
	case c.ImageID != "":
		return configKey(c.ImageID)
	case c.RootChain != "":
		if img := s.Images[c.ImageDigest]; img != nil && img.ChainID == c.RootChain {
			return targetKey(c.ImageDigest)
		}
		return chainKey(c.RootChain)
	}
	return targetKey(c.ImageDigest)
}

// contentKeys are the use keys that name img by its content, when known:
// its config digest, then its chain id.
func (img *Image) contentKeys() [2]UseKey {
	return [2]UseKey{configKey(img.ConfigDigest), chainKey(img.ChainID)}
}

// Pod is a pod uid seen through its sandbox containers.
type Pod struct {
	UID       string              `json:"uid"`
	Name      string              `json:"name,omitempty"`
	Namespace string              `json:"namespace,omitempty"`
	Sandboxes map[string]struct{} `json:"sandboxes"`
	FirstSeen time.Time           `json:"firstSeen"`
	// GoneAt is when the last sandbox went away; zero while one exists.
	GoneAt time.Time `json:"goneAt"`
}

// New returns an empty, unsynced state.
func New() *State {
	return &State{
		Images:     map[string]*Image{},
		Names:      map[string]string{},
		Containers: map[string]*Container{},
		Pods:       map[string]*Pod{},
		users:      newKeySets(),
		byKey:      newKeySets(),
		dead:       map[string]*Container{},
	}
}

// Pinned reports whether any name of the image carries the CRI pinned label.
func (img *Image) Pinned() bool {
	for _, n := range img.Names {
		if n.Labels[LabelPinned] == LabelPinnedValue {
			return true
		}
	}
	return false
}

// EvictUnit groups dead containers the way the kubelet does: pod uid and
// container name for CRI containers, the container itself otherwise.
func (c *Container) EvictUnit() string {
	if c.evictUnit != "" {
		return c.evictUnit
	}
	return c.unit()
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

func (c *Container) unit() string {
	if c.CRIKind == KindContainer && c.PodUID != "" && c.ContainerName != "" {
		return c.PodUID + "/" + c.ContainerName
	}
	return c.ID
}

// Dead reports whether the container's task has exited.
func (c *Container) Dead() bool { return c.State == StateExited }

// DeadContainers calls f with each dead container (see Dead), in no
// order, until f returns false: a look at the dead ones costs nothing per
// live container.
func (s *State) DeadContainers(f func(*Container) bool) {
	for _, c := range s.dead {
		if !f(c) {
			return
		}
	}
}

// Alive reports whether a sandbox of the pod exists.
func (p *Pod) Alive() bool { return len(p.Sandboxes) > 0 }

// InUse reports whether any container holds a key of the image with this
// target digest (or, for a digest no image has, the digest itself).
func (s *State) InUse(digest string) bool {
	if img := s.Images[digest]; img != nil {
		return s.ImageInUse(img)
	}
	return s.users.has(targetKey(digest))
}

// ImageInUse is InUse for an image the caller holds: whether any container
// holds one of its keys.
func (s *State) ImageInUse(img *Image) bool {
	return !s.eachUse(img, func(string) bool { return false })
}

// ImageUsers returns the ids of the containers that hold img, sorted; nil
// when none does.
func (s *State) ImageUsers(img *Image) []string {
	var ids []string
	s.eachUse(img, func(id string) bool {
		ids = append(ids, id)
		return true
	})
	slices.Sort(ids)
	return slices.Compact(ids)
}

// DigestUsers is ImageUsers of the image with this target digest; for a
// digest no image has (any more), the containers that hold the digest
// itself.
func (s *State) DigestUsers(digest string) []string {
	if img := s.Images[digest]; img != nil {
		return s.ImageUsers(img)
	}
	return s.users.members(targetKey(digest))
}

// eachUse calls f with each container holding a use key of img (its
// target, then its content keys; a container may come more than once)
// until f returns false; it reports whether f never did.
func (s *State) eachUse(img *Image, f func(id string) bool) bool {
	if !s.users.each(targetKey(img.Digest), f) {
		return false
	}
	for _, k := range img.contentKeys() {
		if !k.IsZero() && !s.users.each(k, f) {
			return false
		}
	}
	return true
}

// LastUsed is now while a container holds the image, else the time the
// last one let go (zero if none ever did).
func (s *State) LastUsed(img *Image, now time.Time) time.Time {
	if s.ImageInUse(img) {
		return now
	}
	return img.LastUsed.Time()
}

// Apply folds one event into the state. It is deterministic and does no I/O;
// events about unknown objects are ignored, so duplicates and late events are
// harmless. A Listing must go through Reconcile instead.
func (s *State) Apply(ev events.Event) {
	s.Seq++
	switch e := ev.(type) {
	case events.ImageUpserted:
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
	}
}

func (s *State) upsertImage(e events.ImageUpserted) {
	if old, ok := s.Names[e.Name]; ok && old != e.Digest {
		s.dropName(e.Name)
	}
	img := s.Images[e.Digest]
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
	if img := s.Images[digest]; img != nil {
		img.Names.remove(name)
		if len(img.Names) == 0 {
			s.unindex(img)
			delete(s.Images, digest)
		}
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
	c.Created = StampOf(e.Created)
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
		p.Sandboxes[c.ID] = struct{}{}
	}
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

// op records a client operation on c at at.
func (c *Container) op(at time.Time) {
	if at := StampOf(at); at.After(c.LastOpAt) {
		c.LastOpAt = at
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

// addSorted returns set (sorted, no duplicates) with v in it.
func addSorted(set []string, v string) []string {
	i, found := slices.BinarySearch(set, v)
	if found {
		return set
	}
	return slices.Insert(set, i, v)
}

// removeSorted returns set (sorted) without v.
func removeSorted(set []string, v string) []string {
	i, found := slices.BinarySearch(set, v)
	if !found {
		return set
	}
	return slices.Delete(set, i, i+1)
}

// touch moves LastUsed of the images named by key forward only, so late
// events cannot rewind history.
func (s *State) touch(key UseKey, t time.Time) {
	at := StampOf(t)
	bump := func(img *Image) {
		if img != nil && at.After(img.LastUsed) {
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

// index and unindex keep byKey in step with an image's content keys.
func (s *State) index(img *Image) {
	for _, k := range img.contentKeys() {
		if !k.IsZero() {
			s.byKey.add(k, img.Digest)
		}
	}
}

func (s *State) unindex(img *Image) {
	for _, k := range img.contentKeys() {
		s.byKey.remove(k, img.Digest)
	}
}

// reindex rebuilds byKey from Images and dead from Containers, after
// decoding or copying a state.
func (s *State) reindex() {
	s.byKey = newKeySets()
	for _, img := range s.Images {
		s.index(img)
	}
	s.dead = map[string]*Container{}
	for id, c := range s.Containers {
		if c.Dead() {
			s.dead[id] = c
		}
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

// ForgetPodsGoneBefore drops pods whose last sandbox went away before t, so
// the pod history stays bounded. Live calls it when it takes a snapshot.
func (s *State) ForgetPodsGoneBefore(t time.Time) {
	for uid, p := range s.Pods {
		if !p.Alive() && p.GoneAt.Before(t) {
			delete(s.Pods, uid)
		}
	}
}
