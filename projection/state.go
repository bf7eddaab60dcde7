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

// State is the projection. Fields are exported for persistence and for
// read-only use by planners; mutate only through Apply.
type State struct {
	Images     map[string]*Image     `json:"images"`     // by target digest
	Names      map[string]string     `json:"-"`          // image name -> target digest; derived from Images (fill)
	Containers map[string]*Container `json:"containers"` // by id
	Pods       map[string]*Pod       `json:"pods"`       // by pod uid
	// Deletions are the images this agent's GC deleted within their
	// regret window, by digest (see Deletion).
	Deletions map[string]*Deletion `json:"deletions,omitempty"`
	// deletedNames maps each name of a deletion to its digest; derived
	// (indexDeletions), never persisted.
	deletedNames map[string]string
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
	// tracing says a tracer reads touched: the digests of the images the
	// event being applied may have changed (their names, size, keys or
	// users). Neither is persisted or cloned.
	tracing bool
	touched []string
}

// Image is one target digest with all the names that point at it.
type Image struct {
	Digest string     `json:"digest"`
	Names  ImageNames `json:"names"`
	Size   int64      `json:"size"`
	// Created is the earliest creation time (containerd's) of the name
	// records seen since a name of it last went: a relist that finds
	// every name of it made later knows it was pulled again meanwhile.
	Created   Stamp `json:"created,omitzero"`
	FirstSeen Stamp `json:"firstSeen"`
	// LastUsed is when a container last started or stopped referencing the
	// image; while any does, the image counts as used now (see State.LastUsed).
	LastUsed Stamp `json:"lastUsed"`
	// ConfigDigest (the CRI image id) and ChainID (of the top layer) say
	// what content the image is, so containers are matched to it by what
	// they run, not by a name that may have moved.
	ConfigDigest string `json:"configDigest,omitempty"`
	ChainID      string `json:"chainID,omitempty"`
}

// Pod is a pod uid seen through its sandbox containers.
type Pod struct {
	UID       string              `json:"uid"`
	Name      string              `json:"name,omitempty"`
	Namespace string              `json:"namespace,omitempty"`
	Sandboxes map[string]struct{} `json:"sandboxes"`
	// LogDir is the pod's log directory CRI was given for its latest
	// sandbox (events.ContainerUpserted.LogDir): where CRI writes its
	// containers' logs. Empty when no sandbox said.
	LogDir    string    `json:"logDir,omitempty"`
	FirstSeen time.Time `json:"firstSeen"`
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
		Deletions:  map[string]*Deletion{},
		users:      newKeySets(),
		byKey:      newKeySets(),
		dead:       map[string]*Container{},

		deletedNames: map[string]string{},
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

// Alive reports whether a sandbox of the pod exists.
func (p *Pod) Alive() bool { return len(p.Sandboxes) > 0 }

// ForgetPodsGoneBefore drops pods whose last sandbox went away before t, so
// the pod history stays bounded. Live calls it when it takes a snapshot.
func (s *State) ForgetPodsGoneBefore(t time.Time) {
	for uid, p := range s.Pods {
		if !p.Alive() && p.GoneAt.Before(t) {
			delete(s.Pods, uid)
		}
	}
}
