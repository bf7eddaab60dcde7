package projection

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is the projection as operators and tools read it (/status,
// `gcagent status`): sorted, with effective last-used times.
type Report struct {
	Synced bool      `json:"synced"`
	Seq    uint64    `json:"seq"`
	At     time.Time `json:"at"`
	// Namespaces are the containerd namespaces reported, sorted; each
	// image and container says which it is in.
	Namespaces []string          `json:"namespaces"`
	Images     []ImageReport     `json:"images"`
	Containers []ContainerReport `json:"containers"`
	Pods       []PodReport       `json:"pods"`
}

// ImageReport is one image in a Report.
type ImageReport struct {
	Namespace string    `json:"namespace"` // containerd's
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"`
	Size      int64     `json:"size"`
	FirstSeen time.Time `json:"firstSeen"`
	LastUsed  time.Time `json:"lastUsed,omitzero"` // never used: left out
	Users     []string  `json:"users"`
	Pinned    bool      `json:"pinned"`
	// ID is the config digest (CRI's image id), ChainID that of the top
	// layer's snapshot: what containers are matched to the image by.
	ID      string `json:"id,omitempty"`
	ChainID string `json:"chainID,omitempty"`
}

// ContainerReport is one container in a Report.
type ContainerReport struct {
	Namespace   string         `json:"namespace"` // containerd's
	ID          string         `json:"id"`
	Image       string         `json:"image"`
	ImageDigest string         `json:"imageDigest"`
	State       ContainerState `json:"state"`
	ExitedAt    *time.Time     `json:"exitedAt,omitempty"`
	ExitStatus  uint32         `json:"exitStatus"`
	Kind        string         `json:"kind"` // sandbox, container, or native
	PodUID      string         `json:"podUID,omitempty"`
	SandboxID   string         `json:"sandboxID,omitempty"` // a CRI container's (or sandbox's own)
	EvictUnit   string         `json:"evictUnit"`
}

// PodReport is one pod in a Report.
type PodReport struct {
	UID       string     `json:"uid"`
	Name      string     `json:"name,omitempty"`
	Namespace string     `json:"namespace,omitempty"`
	Alive     bool       `json:"alive"`
	Sandboxes []string   `json:"sandboxes"`
	GoneAt    *time.Time `json:"goneAt,omitempty"`
}

// NewReport renders the states (one per namespace, sorted) as of now:
// synced when every one is, Seq their sum.
func NewReport(now time.Time, states ...*State) Report {
	r := Report{Synced: len(states) > 0, At: now, Namespaces: []string{},
		Images: []ImageReport{}, Containers: []ContainerReport{}, Pods: []PodReport{}}
	for _, s := range states {
		r.Synced = r.Synced && s.Synced
		r.Namespaces = append(r.Namespaces, s.Namespace)
		r.add(s, now)
	}
	r.Seq = SeqOf(states)
	return r
}

func (r *Report) add(s *State, now time.Time) {
	for _, d := range slices.Sorted(maps.Keys(s.Images)) {
		img := s.Images[d]
		r.Images = append(r.Images, ImageReport{
			Namespace: s.Namespace, Digest: d, Names: img.Names.Strings(), Size: img.Size,
			FirstSeen: img.FirstSeen.Time(), LastUsed: s.LastUsed(img, now),
			Users: append([]string{}, s.ImageUsers(img)...), Pinned: img.Pinned(), ID: img.ConfigDigest, ChainID: img.ChainID,
		})
	}
	for _, id := range slices.Sorted(maps.Keys(s.Containers)) {
		c := s.Containers[id]
		kind := c.CRIKind
		if kind == "" {
			kind = "native"
		}
		cr := ContainerReport{Namespace: s.Namespace, ID: id, Image: c.Image, ImageDigest: c.ImageDigest, State: c.State,
			ExitStatus: c.ExitStatus, Kind: kind, PodUID: c.PodUID, SandboxID: c.SandboxID, EvictUnit: c.EvictUnit()}
		if c.State == StateExited {
			t := c.ExitedAt.Time()
			cr.ExitedAt = &t
		}
		r.Containers = append(r.Containers, cr)
	}
	for _, uid := range slices.Sorted(maps.Keys(s.Pods)) {
		p := s.Pods[uid]
		pr := PodReport{UID: uid, Name: p.Name, Namespace: p.Namespace, Alive: p.Alive(), Sandboxes: sortedKeys(p.Sandboxes)}
		if !p.Alive() {
			t := p.GoneAt
			pr.GoneAt = &t
		}
		r.Pods = append(r.Pods, pr)
	}
}

func sortedKeys(m map[string]struct{}) []string {
	out := slices.Sorted(maps.Keys(m))
	if out == nil {
		out = []string{}
	}
	return out
}

// ShortDigest abbreviates a digest for tables.
func ShortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	return d
}
