package schema

import "time"

// The data of each event, by kind. docs/nats.md describes them.

// Reason says why an item was deleted or kept. The values are stable: they
// appear in logs, metrics labels and payloads; gc and logs name them.
type Reason string

// ImageOutcome is what a pass did with one image the plan named: removed,
// or skipped with the reason.
type ImageOutcome struct {
	Namespace string    `json:"namespace"`
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"`
	Size      int64     `json:"bytes"` // estimated: the image's size
	FirstSeen time.Time `json:"firstSeen"`
	LastUsed  time.Time `json:"lastUsed,omitzero"`
	// Rule is why the plan (or the measured disk) chose it: max-age or space.
	Rule   Reason `json:"rule"`
	Action string `json:"action"` // removed or skipped
	// Reason is Rule when removed, else why it was skipped.
	Reason Reason `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Freed is the measured growth of available bytes across the delete.
	Freed int64     `json:"freedBytes"`
	Via   string    `json:"via,omitempty"` // cri or native
	At    time.Time `json:"at"`
	// Beyond says the plan's estimate had said enough was freed before this
	// image, but the measured disk was still above the low threshold.
	Beyond bool `json:"beyondEstimate,omitempty"`
}

// ImageEvent is the payload of an image action.
type ImageEvent struct {
	ImageOutcome
	DryRun bool `json:"dryRun,omitempty"`
}

// ImageRegret is the payload of image.regretted: an image this agent's GC
// deleted came back on the node (its digest, or a name it had) within the
// regret window. It is published once per deletion.
type ImageRegret struct {
	Namespace string   `json:"namespace"`
	Digest    string   `json:"digest"`
	Names     []string `json:"names"` // the names it had when deleted
	// ReturnedAs is the name (or the digest) it came back under.
	ReturnedAs string    `json:"returnedAs"`
	DeletedAt  time.Time `json:"deletedAt"`
	ReturnedAt time.Time `json:"returnedAt"`
	// ReturnAfterSeconds is the time from the delete to the return.
	ReturnAfterSeconds float64 `json:"returnAfterSeconds"`
	// Bytes is the deleted image's size (estimated), FreedBytes what
	// statfs saw freed by its delete (0 unknown).
	Bytes      int64 `json:"bytes"`
	FreedBytes int64 `json:"freedBytes"`
	// Rule is the planner's rule that deleted it (space, max-age) and
	// Trigger what started the pass (disk, max-age, episode, manual...).
	Rule    Reason `json:"rule"`
	Trigger string `json:"trigger"`
}

// GCPass is the payload of a pass action: the pass without the
// per-image lists, which are published one event each.
type GCPass struct {
	Start          time.Time `json:"start"`
	End            time.Time `json:"end,omitzero"`
	Trigger        string    `json:"trigger"`
	DryRun         bool      `json:"dryRun,omitempty"`
	Usage          int       `json:"usage"`
	AmountToFree   int64     `json:"amountToFree"`
	Planned        int       `json:"planned"`
	Removed        int       `json:"removed"`
	Skipped        int       `json:"skipped"`
	EstimatedBytes int64     `json:"bytes"`
	FreedBytes     int64     `json:"freedBytes"`
	UsageAfter     int       `json:"usageAfter"`
	// Shortfall says why a triggered pass planned less than it had to
	// free (how many images each rule kept), and FirstEligibleAt when the
	// first too-young image may go.
	Shortfall       string    `json:"shortfall,omitempty"`
	FirstEligibleAt time.Time `json:"firstEligibleAt,omitzero"`
	Error           string    `json:"error,omitempty"`
}

// OwnerCleanup is what DeleteNative cleaned, after the container itself,
// of the state its owner keeps for it outside containerd: for a container
// made by nerdctl, what `nerdctl rm` would have removed (its name lock,
// hosts dir and state dir with its json logs). The zero value: the
// container has no such owner.
type OwnerCleanup struct {
	// Owner is who made the container: nerdctl.
	Owner string `json:"owner"`
	// Removed are the paths removed, in the order removed.
	Removed []string `json:"removed,omitempty"`
	// Bytes are the bytes allocated to the files removed.
	Bytes int64 `json:"bytes,omitempty"`
	// NameHeldBy is the id its name lock held when that was another
	// container's: the lock was kept.
	NameHeldBy string `json:"nameHeldBy,omitempty"`
	// Error says what could not be cleaned; what is listed was.
	Error string `json:"error,omitempty"`
}

// ContainerRemoval is the data of a published container.removed action.
type ContainerRemoval struct {
	Namespace     string    `json:"namespace"`
	ID            string    `json:"id"`
	Kind          string    `json:"kind"`
	EvictUnit     string    `json:"evictUnit"`
	PodUID        string    `json:"podUID,omitempty"`
	PodName       string    `json:"podName,omitempty"`
	PodNamespace  string    `json:"podNamespace,omitempty"`
	ContainerName string    `json:"containerName,omitempty"`
	Image         string    `json:"image,omitempty"`
	ExitedAt      time.Time `json:"exitedAt,omitzero"`
	EligibleAt    time.Time `json:"eligibleAt,omitzero"`
	Reason        Reason    `json:"reason"`
	Rule          string    `json:"rule"`
	At            time.Time `json:"at"`
	LatencySecs   float64   `json:"latencySeconds"`
	DryRun        bool      `json:"dryRun,omitempty"`
	// OwnerState is what was cleaned, after the delete, of the state the
	// container's owner keeps outside containerd; absent for a container
	// without such an owner.
	OwnerState *OwnerCleanup `json:"ownerState,omitempty"`
	// Logs are the log files and link removed with a CRI container (in a
	// dry run: to remove); absent for other kinds.
	Logs *ContainerLogs `json:"logs,omitempty"`
}

// ContainerLogs are what goes with a CRI container's removal besides the
// container, as with the kubelet's own removal (removeContainerLog): the
// attempt's log file, its rotated files beside it (<log>.<timestamp>,
// .gz) and its legacy link in the kubelet's log link dir.
type ContainerLogs struct {
	// Path is the log's path as CRI gives it (the host's).
	Path string `json:"path,omitempty"`
	// Files are the files removed (in a dry run or a plan: to remove),
	// where the agent sees them.
	Files []string `json:"files,omitempty"`
	// Link is the legacy link removed (or to remove).
	Link string `json:"link,omitempty"`
	// Bytes are the bytes allocated to the files.
	Bytes int64 `json:"bytes,omitempty"`
	// Kept says why the files were not looked for (no log path, one
	// outside the pod's dir under the pod log dir, a symlink or a mount
	// point on the way): they stay.
	Kept string `json:"kept,omitempty"`
}

// ContainerSkip is the data of a published container.skipped action: the
// removal that was not made, and why.
type ContainerSkip struct {
	ContainerRemoval
	SkipReason string `json:"skipReason"`
}

// LogKind names a log entry's kind: a symlink of the kubelet's log dir, or
// a pod log dir, or a file removed with a CRI container (LogKindFile).
type LogKind string

// LogKindFile is a CRI container's log file (or one of its rotated files)
// in its pod's dir, removed with the container (log.removed only when the
// container then stayed; else its container.removed lists it).
const LogKindFile LogKind = "file"

// LogRemoval is the data of a published log.removed (and, inside a skip, of
// a dry run's log.skipped): one removed entry.
type LogRemoval struct {
	Kind      LogKind `json:"kind"`
	Dir       string  `json:"dir"`  // the configured directory
	Name      string  `json:"name"` // raw name relative to Dir
	Reason    Reason  `json:"reason"`
	Container string  `json:"container,omitempty"`
	UID       string  `json:"uid,omitempty"`
	// Bytes are the allocated bytes of the files removed, an estimate
	// (hard links); in a dry run, of the files that would be.
	Bytes int64 `json:"bytes"`
	// Entries counts what was removed (or would be): files, links and
	// directories, a pod dir itself included.
	Entries int       `json:"entries,omitempty"`
	At      time.Time `json:"at"`
	DryRun  bool      `json:"dryRun,omitempty"`
	// Namespace is the containerd namespace of the pods the kubelet's logs
	// belong to: CRI's.
	Namespace string `json:"namespace"`
	// Partial says the removal stopped partway: Bytes and Entries are what
	// went, Error why the rest stayed. For a file or link removed with a
	// CRI container (Container, Reason the container's) whose removal
	// then did not happen, Error says why the container stayed.
	Partial bool   `json:"partial,omitempty"`
	Error   string `json:"error,omitempty"`
}

// LogSkip is the data of a published log.skipped: the removal that was not
// made, and why.
type LogSkip struct {
	LogRemoval
	SkipReason string `json:"skipReason"`
}

// Heartbeat is the data of agent.heartbeat.
type Heartbeat struct {
	DiskUsagePercent int     `json:"diskUsagePercent"`
	CapacityBytes    uint64  `json:"capacityBytes"`
	AvailableBytes   uint64  `json:"availableBytes"`
	Images           int     `json:"images"`
	Containers       int     `json:"containers"`
	ReclaimableBytes int64   `json:"reclaimableBytes"` // sizes of images no rule protects
	Synced           bool    `json:"synced"`
	Outbox           int     `json:"outbox"`
	NATSMode         string  `json:"natsMode"`
	LastGC           *LastGC `json:"lastGC,omitempty"`
	DiskError        string  `json:"diskError,omitempty"` // why the disk figures are zero
}

// NodeStatus is a node's last value in the status stream
// (gcagent.v1.status.<cluster>.<node>): its latest heartbeat and what a
// fleet view needs to judge it.
type NodeStatus struct {
	Cluster                  string    `json:"cluster"`
	Node                     string    `json:"node"`
	Version                  string    `json:"version"`
	At                       time.Time `json:"at"`
	HeartbeatIntervalSeconds float64   `json:"heartbeatIntervalSeconds"`
	ImageGCHighThreshold     int       `json:"imageGCHighThreshold"`
	ImageGCLowThreshold      int       `json:"imageGCLowThreshold"`
	Heartbeat
}

// LastGC is the last image GC pass in heartbeats: counts, not lists.
type LastGC struct {
	Kind       string    `json:"kind"`
	At         time.Time `json:"at"`
	Trigger    string    `json:"trigger"`
	DryRun     bool      `json:"dryRun,omitempty"`
	Removed    int       `json:"removed"`
	Skipped    int       `json:"skipped"`
	Bytes      int64     `json:"bytes"`
	FreedBytes int64     `json:"freedBytes"`
	Usage      int       `json:"usage"`
	Error      string    `json:"error,omitempty"`
}

// AgentStarted is the data of agent.started: what this boot runs with.
type AgentStarted struct {
	Version              string `json:"version"`
	Hostname             string `json:"hostname"`
	Namespace            string `json:"namespace"`
	ExcludeNamespace     string `json:"excludeNamespace"`
	DryRun               bool   `json:"dryRun"`
	PruneContainers      string `json:"pruneContainers"`
	ImageGCHighThreshold int    `json:"imageGCHighThreshold"`
	ImageGCLowThreshold  int    `json:"imageGCLowThreshold"`
	// Policy is every setting that decides what goes, its value and where
	// it came from (default, flag, env, file, kubelet-config).
	Policy []Setting `json:"policy,omitempty"`
	// KubeletNotes are the warnings about the kubelet's config
	// (--kubelet-config): its own image GC still on, eviction first.
	KubeletNotes []string `json:"kubeletNotes,omitempty"`
}

// Setting is one setting in force: its flag name, its value and where it
// came from ("default", "flag", "env GCAGENT_X", "file PATH:LINE",
// "kubelet-config PATH").
type Setting struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// StateReset is the data of agent.state_reset: the state file was
// unreadable at start and moved aside; what that lost.
type StateReset struct {
	Path    string `json:"path"`
	MovedTo string `json:"movedTo"`
	Error   string `json:"error"`
	Lost    string `json:"lost"`
	At      string `json:"at"`
}
