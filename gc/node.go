package gc

import (
	"context"
	"errors"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/schema"
)

// This file declares what the executors need from the node (the node
// adapter implements it) and from the delete transaction.

// ImageName is one name of an image as containerd holds it right now.
// Created is the record's creation time as containerd stamped it: with the
// name, the record's identity (a name deleted and made again by a pull is
// another record, with another creation time).
type ImageName struct {
	Name    string
	Labels  map[string]string
	Created time.Time
}

// ImageRef names one image for the in-use question: its target digest,
// the names it has now, its config digest (CRI's image id) and the chain id
// of its top layer, the last two empty when unknown.
type ImageRef struct {
	Digest string
	Names  []string
	Config string
	Chain  string
}

// Holder is one thing that holds an image right now.
type Holder struct {
	// Kind is container (its rootfs descends from the image, or it names
	// the image and has no rootfs snapshot), snapshot (an active or view
	// snapshot that descends from it: an image volume, a mounted view),
	// cri (CRI reports a container of the image id or mounting it) or
	// lease (a lease holds the image's content: a pull or import at work).
	Kind string
	ID   string
}

// Holder kinds.
const (
	HolderContainer = "container"
	HolderSnapshot  = "snapshot"
	HolderCRI       = "cri"
	HolderLease     = "lease"
)

// ErrImageChanged says the image's names changed between the re-check and
// the delete: a name moved to another target, or a name the re-check did
// not see points at it (a pull made it during the call). Such a name is
// never deleted; the next pass decides anew.
var ErrImageChanged = errors.New("image names changed since the re-check")

// ErrOwnerWon says the container's owner deleted it (or its task) between
// the re-check and our delete: not an error, the owner was first, and not
// our removal.
var ErrOwnerWon = errors.New("owner deleted it first")

// imageNode is what the image executor needs from the node: the image
// and what holds it, read again right before a delete, and the delete.
type imageNode interface {
	// ImageNames returns every name in namespace ns pointing at the target
	// digest now, sorted by name.
	ImageNames(ctx context.Context, ns, digest string) ([]ImageName, error)
	// ImageHolders returns what holds img in namespace ns now: the one
	// answer to "is this image in use?", the same rule the projection
	// indexes with.
	ImageHolders(ctx context.Context, ns string, img ImageRef) ([]Holder, error)
	// RemoveImage deletes all names (of one digest) in namespace ns,
	// synchronously, and says how (cri or native). It deletes only these
	// names, each as the re-check saw it (its creation time): a name made
	// since (a pull during the call) is kept. ErrImageChanged when a name
	// moved or was made since: nothing more was deleted. Any other error
	// leaves the outcome unknown.
	RemoveImage(ctx context.Context, ns, digest string, names []ImageName) (string, error)
}

// Liveness is what the runtime says of a container right before it would
// be deleted. Only LiveDead may be deleted; LiveGone needs nothing.
type Liveness string

// Liveness values; all but LiveGone and LiveDead keep the container, and
// serve as the reason it was kept.
const (
	LiveGone          Liveness = "gone"           // not found: already deleted
	LiveDead          Liveness = "dead"           // task stopped or deleted after its exit; CRI exited; sandbox not ready and empty
	LiveRunning       Liveness = "running"        // task running or paused; CRI running; sandbox ready
	LiveCreated       Liveness = "created"        // task or CRI container created, not started
	LiveUnknown       Liveness = "unknown"        // the runtime cannot tell
	LiveHasContainers Liveness = "has-containers" // a sandbox that still holds containers
	LiveLeased        Liveness = "leased"         // a containerd lease (a client at work) holds its snapshot
	// LiveOwnerState: its owner keeps state outside containerd that the
	// delete would orphan: a container made by nerdctl whose labels do not
	// fit nerdctl's layout under the configured data root, or that holds
	// state only `nerdctl rm` frees (a shareable IPC tmpfs, image mounts).
	LiveOwnerState Liveness = "owner-state"
	// LiveRestartManaged: a restart policy (containerd.io/restart.*, as
	// nerdctl --restart sets it) wants it running: a stopped task is not
	// dead, containerd's restart monitor starts it again.
	LiveRestartManaged Liveness = "restart-managed"
)

// Kept is the error a liveness re-check returns to keep a container for a
// reason its Liveness names only broadly: the executor keeps the container
// as for Live (never counted as a failed re-check) and shows Why, once, in
// its log and in the result.
type Kept struct {
	Live Liveness
	Why  string
}

// Error names the liveness and why.
func (k *Kept) Error() string { return "kept (" + string(k.Live) + "): " + k.Why }

// deleteLog begins delete transactions (*deletion.Manager).
type deleteLog interface {
	// Begin records the intent of a with the object's identity id.
	Begin(ctx context.Context, ns string, a schema.Action, id *deletion.Identity) (*deletion.Tx, error)
	// Generation changes whenever a delete whose outcome was unknown has
	// been settled: a disk measurement from before is stale.
	Generation() uint64
	// Unsettled counts the deletes whose outcome containerd has not told.
	Unsettled() int
}
