// Package gc holds gcagent's pure planners: given the projection, the policy
// and the time, they decide which images and dead containers to delete and
// say why each other one is kept.
//
// Planners do no I/O and read the state without changing it; executors apply
// a plan and re-check each item right before they delete it. Plans are
// deterministic for a given input, so golden files and dry runs are stable.
package gc

import (
	"time"

	"github.com/gcagent/gcagent/schema"
)

// Reason says why a plan deletes or keeps an item (schema.Reason). The
// values are stable: they appear in logs, metrics labels and NATS payloads.
type Reason = schema.Reason

// Why an image is kept.
const (
	ReasonInUse        Reason = "in-use"             // a container of the namespace references it (by its image name's target)
	ReasonInUseByID    Reason = "in-use-by-image-id" // a container runs it: CRI's image id of the container is its config digest
	ReasonInUseBySnap  Reason = "in-use-by-snapshot" // a container's rootfs (or a view) was prepared from its top layer
	ReasonImageVolume  Reason = "image-volume"       // mounted into a pod as an OCI image volume
	ReasonPinned       Reason = "pinned"             // a name carries io.cri-containerd.pinned=pinned
	ReasonSandboxImage Reason = "sandbox-image"      // it is a configured sandbox (pause) image
	ReasonKeepPattern  Reason = "keep-pattern"       // a name matches a keep pattern
	ReasonNotNeeded    Reason = "not-needed"         // eligible, but this pass frees enough without it
	// ReasonKeepListUnread: the fleet keep list was never read (NATS has
	// not answered since the agent started, and no list was saved): it
	// could name the image, so deletes wait for it, up to a bound.
	ReasonKeepListUnread Reason = "keep-list-unread"
)

// Why an image is deleted.
const (
	ReasonMaxAge Reason = "max-age" // unused for longer than MaxAge
	ReasonSpace  Reason = "space"   // needed to bring the disk down to the low threshold
)

// Why an image or a container is kept because of its age.
const (
	ReasonTooYoung Reason = "too-young" // younger than MinAge
)

// Why a container is kept.
const (
	ReasonRunning          Reason = "running"            // its task runs
	ReasonNeverStarted     Reason = "never-started"      // no task ever exited: not dead
	ReasonWithinCap        Reason = "within-cap"         // dead, but within the per-unit and global caps
	ReasonPruneMode        Reason = "prune-mode"         // excluded by the prune mode
	ReasonPodHasContainers Reason = "pod-has-containers" // a sandbox that still holds a container (CRI's sandbox id)
	ReasonNewestSandbox    Reason = "newest-sandbox"     // the newest sandbox of a pod that is still there
	ReasonStarting         Reason = "starting"           // a CRI container created, not started, within NeverStartedGrace
	// Plain containers: the client that owns one may still be using it.
	ReasonRestartManaged     Reason = "restart-managed"     // a restart policy wants it running
	ReasonAwaitingCollection Reason = "awaiting-collection" // exited; its client may still read the exit status
	ReasonOwnerActive        Reason = "owner-active"        // a client operated on it within OwnerQuiet
	ReasonLeased             Reason = "leased"              // a containerd lease (a client at work) holds its snapshot
)

// Why a container is deleted.
const (
	ReasonPerUnitCap      Reason = "per-unit-cap"     // beyond MaxPerEvictUnit in its evict unit
	ReasonGlobalCap       Reason = "global-cap"       // beyond MaxContainers overall
	ReasonSandboxOrphaned Reason = "sandbox-orphaned" // an exited sandbox holding no container, not its live pod's newest
	ReasonTTLExpired      Reason = "ttl-expired"      // a plain container whose owner is done, past its TTL
	ReasonPodDeleted      Reason = "pod-deleted"      // a dead container or exited sandbox of a deleted pod
)

// InUseReason reports whether r says an image is held by a container.
func InUseReason(r Reason) bool {
	switch r {
	case ReasonInUse, ReasonInUseByID, ReasonInUseBySnap, ReasonImageVolume:
		return true
	}
	return false
}

// drain takes a pending signal off c, if there is one.
func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// later returns the later of two instants.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// earliest lowers *t to c when c is set and earlier, treating zero as unset.
func earliest(t *time.Time, c time.Time) {
	if !c.IsZero() && (t.IsZero() || c.Before(*t)) {
		*t = c
	}
}
