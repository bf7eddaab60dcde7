package projection

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
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

// String returns the state's name, or state(n) for an unknown one.
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

// UnmarshalJSON reads a Container as MarshalJSON writes it, image volumes
// included.
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

// EvictUnit groups dead containers the way the kubelet does: pod uid and
// container name for CRI containers, the container itself otherwise.
func (c *Container) EvictUnit() string {
	if c.evictUnit != "" {
		return c.evictUnit
	}
	return c.unit()
}

func (c *Container) unit() string {
	if c.CRIKind == KindContainer && c.PodUID != "" && c.ContainerName != "" {
		return c.PodUID + "/" + c.ContainerName
	}
	return c.ID
}

// Dead reports whether the container's task has exited.
func (c *Container) Dead() bool { return c.State == StateExited }

// op records a client operation on c at at.
func (c *Container) op(at time.Time) {
	if at := StampOf(at); at.After(c.LastOpAt) {
		c.LastOpAt = at
	}
}
