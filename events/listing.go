package events

import "time"

// KindListing is the kind of a Listing. A Listing is never journaled: the
// projection turns it into the events that bring it up to date.
const KindListing Kind = "listing"

// TaskStatus is the state of a container's init process in a listing.
type TaskStatus string

// Task statuses, as containerd reports them.
const (
	TaskCreated TaskStatus = "created"
	TaskRunning TaskStatus = "running"
	TaskStopped TaskStatus = "stopped"
	TaskPaused  TaskStatus = "paused"
	TaskUnknown TaskStatus = "unknown"
)

// Task is a container's init process as listed by containerd.
type Task struct {
	ContainerID string     `json:"containerID"`
	Pid         uint32     `json:"pid"`
	Status      TaskStatus `json:"status"`
	ExitStatus  uint32     `json:"exitStatus"`
	ExitedAt    time.Time  `json:"exitedAt"`
}

// Listing is a full picture of the namespace, taken right after a
// (re)subscribe and periodically. Images has one entry per name.
type Listing struct {
	At         time.Time
	Images     []ImageUpserted
	Containers []ContainerUpserted
	Tasks      []Task
}

func (l Listing) Time() time.Time { return l.At }
func (Listing) Kind() Kind        { return KindListing }
