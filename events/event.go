// Package events holds the domain events gcagent journals and their codec:
// plain data that the projection applies and replays. They are made from
// containerd's envelopes and listings by the node adapter (package node);
// nothing here links containerd, gRPC or CRI.
package events

import (
	"encoding/json"
	"fmt"
	"time"
)

// Event is a typed domain event. At is when it happened (containerd's
// envelope timestamp, or the agent's clock for a reconcile), so replaying a
// journal reproduces the same state.
type Event interface {
	Time() time.Time
	Kind() Kind
}

// Kind names an event type in the journal.
type Kind string

// Event kinds. They are stored in the journal: never rename one.
const (
	KindImageUpserted     Kind = "image.upserted"
	KindImageDeleted      Kind = "image.deleted"
	KindContainerUpserted Kind = "container.upserted"
	KindContainerDeleted  Kind = "container.deleted"
	KindTaskStarted       Kind = "task.started"
	KindTaskExited        Kind = "task.exited"
	KindSynced            Kind = "synced"
	KindImageCollected    Kind = "image.collected"
	KindRegretReported    Kind = "image.regret_reported"
)

// Kinds is the closed set of event kinds, in the order above.
var Kinds = []Kind{KindImageUpserted, KindImageDeleted, KindContainerUpserted, KindContainerDeleted,
	KindTaskStarted, KindTaskExited, KindSynced, KindImageCollected, KindRegretReported}

// ImageUpserted says that an image name exists and points at Digest.
type ImageUpserted struct {
	At      time.Time         `json:"at"`
	Name    string            `json:"name"`
	Digest  string            `json:"digest"` // target (manifest or index) digest
	Labels  map[string]string `json:"labels,omitempty"`
	Size    int64             `json:"size"` // manifest-declared (compressed) bytes, as the kubelet sees it
	Created time.Time         `json:"created"`
	// ConfigDigest is the image id CRI and the kubelet know it by (the
	// platform config's digest); ChainID names the snapshot of its top
	// layer, the parent of every container rootfs prepared from it. Both
	// are empty when the content could not be read.
	ConfigDigest string `json:"configDigest,omitempty"`
	ChainID      string `json:"chainID,omitempty"`
}

// ImageDeleted says that an image name is gone.
type ImageDeleted struct {
	At   time.Time `json:"at"`
	Name string    `json:"name"`
}

// ContainerUpserted says that a container exists, with what it references.
type ContainerUpserted struct {
	At            time.Time `json:"at"`
	ID            string    `json:"id"`
	Image         string    `json:"image"`       // the image name the container was created from
	ImageDigest   string    `json:"imageDigest"` // that name's target when the container was seen; may be empty
	CRIKind       string    `json:"criKind,omitempty"`
	PodUID        string    `json:"podUID,omitempty"`
	PodName       string    `json:"podName,omitempty"`
	PodNamespace  string    `json:"podNamespace,omitempty"`
	ContainerName string    `json:"containerName,omitempty"`
	SandboxID     string    `json:"sandboxID,omitempty"`
	// LogDir is, for a CRI sandbox, the pod's log directory CRI was given
	// (its spec's io.kubernetes.cri.sandbox-log-directory): where the
	// pod's containers write their logs. Empty for anything else.
	LogDir  string    `json:"logDir,omitempty"`
	Created time.Time `json:"created"`
	// What the container really runs, whatever its image name points at
	// now: ImageID is the config digest CRI stored for it, RootChain the
	// chain id of the image top its rootfs snapshot descends from (its
	// parent, or the nearest such ancestor above a remapped copy: see
	// node's rootChain). VolumeImageIDs are
	// the config digests of images mounted as OCI image volumes, and
	// VolumeChains the parents of image-volume snapshots a sandbox holds.
	ImageID        string   `json:"imageID,omitempty"`
	RootChain      string   `json:"rootChain,omitempty"`
	VolumeImageIDs []string `json:"volumeImageIDs,omitempty"`
	VolumeChains   []string `json:"volumeChains,omitempty"`
	// RestartManaged says a restart policy (containerd's restart monitor,
	// nerdctl --restart) wants the container running: its exit is not death.
	RestartManaged bool `json:"restartManaged,omitempty"`
}

// ContainerDeleted says that a container is gone.
type ContainerDeleted struct {
	At time.Time `json:"at"`
	ID string    `json:"id"`
}

// TaskStarted says that a container's init process runs.
type TaskStarted struct {
	At          time.Time `json:"at"`
	ContainerID string    `json:"containerID"`
	Pid         uint32    `json:"pid"`
}

// TaskExited says that a container's init process ended (from /tasks/exit,
// /tasks/delete, or a listing that shows it stopped or gone).
type TaskExited struct {
	At          time.Time `json:"at"`
	ContainerID string    `json:"containerID"`
	Pid         uint32    `json:"pid,omitempty"` // 0 when unknown
	ExitStatus  uint32    `json:"exitStatus"`
	ExitedAt    time.Time `json:"exitedAt"`
	// Collected says the task was deleted (/tasks/delete, or a listing
	// found the task gone): its owner has read the exit status.
	Collected bool `json:"collected,omitempty"`
	// Amend says a listing found the container exited with other exit
	// facts than the projection holds (a status it could only guess when
	// the task went away unseen, a run it missed): they replace them.
	Amend bool `json:"amend,omitempty"`
}

// Synced marks the end of a full reconcile with containerd.
type Synced struct {
	At time.Time `json:"at"`
}

// ImageCollected says that this agent's image GC deleted an image: what
// it was and why, kept by the projection until RegretUntil so that its
// return is noticed (a regret), across restarts.
type ImageCollected struct {
	At     time.Time `json:"at"` // when the delete happened
	Digest string    `json:"digest"`
	Names  []string  `json:"names"`
	Size   int64     `json:"size"`            // the image's size (estimated bytes)
	Freed  int64     `json:"freed,omitempty"` // measured on the filesystem; 0 unknown
	// Rule is the planner's rule (space, max-age), Trigger what started
	// the pass (disk, max-age, episode, manual...).
	Rule    string `json:"rule"`
	Trigger string `json:"trigger"`
	// RegretUntil ends the regret window: a return after it is no regret.
	RegretUntil time.Time `json:"regretUntil"`
}

// RegretReported says that the return of the image deleted at Deleted
// (ImageCollected.At) was published: it is reported once.
type RegretReported struct {
	At      time.Time `json:"at"`
	Digest  string    `json:"digest"`
	Deleted time.Time `json:"deleted"`
}

func (e ImageUpserted) Time() time.Time     { return e.At }
func (e ImageCollected) Time() time.Time    { return e.At }
func (e RegretReported) Time() time.Time    { return e.At }
func (e ImageDeleted) Time() time.Time      { return e.At }
func (e ContainerUpserted) Time() time.Time { return e.At }
func (e ContainerDeleted) Time() time.Time  { return e.At }
func (e TaskStarted) Time() time.Time       { return e.At }
func (e TaskExited) Time() time.Time        { return e.At }
func (e Synced) Time() time.Time            { return e.At }

func (ImageUpserted) Kind() Kind     { return KindImageUpserted }
func (ImageDeleted) Kind() Kind      { return KindImageDeleted }
func (ContainerUpserted) Kind() Kind { return KindContainerUpserted }
func (ContainerDeleted) Kind() Kind  { return KindContainerDeleted }
func (TaskStarted) Kind() Kind       { return KindTaskStarted }
func (TaskExited) Kind() Kind        { return KindTaskExited }
func (Synced) Kind() Kind            { return KindSynced }
func (ImageCollected) Kind() Kind    { return KindImageCollected }
func (RegretReported) Kind() Kind    { return KindRegretReported }

type wire struct {
	Kind Kind            `json:"k"`
	Body json.RawMessage `json:"e"`
}

// Marshal encodes an event with its kind, for the journal.
func Marshal(ev Event) ([]byte, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", ev.Kind(), err)
	}
	return json.Marshal(wire{Kind: ev.Kind(), Body: body})
}

// Unmarshal decodes what Marshal wrote. An unknown kind is an error, so a
// corrupt or newer journal entry is reported, not silently applied.
func Unmarshal(b []byte) (Event, error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("decode event: %w", err)
	}
	var ev Event
	var err error
	switch w.Kind {
	case KindImageUpserted:
		ev, err = decode[ImageUpserted](w.Body)
	case KindImageDeleted:
		ev, err = decode[ImageDeleted](w.Body)
	case KindContainerUpserted:
		ev, err = decode[ContainerUpserted](w.Body)
	case KindContainerDeleted:
		ev, err = decode[ContainerDeleted](w.Body)
	case KindTaskStarted:
		ev, err = decode[TaskStarted](w.Body)
	case KindTaskExited:
		ev, err = decode[TaskExited](w.Body)
	case KindSynced:
		ev, err = decode[Synced](w.Body)
	case KindImageCollected:
		ev, err = decode[ImageCollected](w.Body)
	case KindRegretReported:
		ev, err = decode[RegretReported](w.Body)
	default:
		return nil, fmt.Errorf("decode event: unknown kind %q", w.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", w.Kind, err)
	}
	return ev, nil
}

func decode[T Event](b []byte) (Event, error) {
	var v T
	err := json.Unmarshal(b, &v)
	return v, err
}
