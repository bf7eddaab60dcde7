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
	Synced     bool              `json:"synced"`
	Seq        uint64            `json:"seq"`
	At         time.Time         `json:"at"`
	Images     []ImageReport     `json:"images"`
	Containers []ContainerReport `json:"containers"`
	Pods       []PodReport       `json:"pods"`
}

// ImageReport is one image in a Report.
type ImageReport struct {
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"`
	Size      int64     `json:"size"`
	FirstSeen time.Time `json:"firstSeen"`
	LastUsed  time.Time `json:"lastUsed"`
	Users     []string  `json:"users"`
	Pinned    bool      `json:"pinned"`
}

// ContainerReport is one container in a Report.
type ContainerReport struct {
	ID          string         `json:"id"`
	Image       string         `json:"image"`
	ImageDigest string         `json:"imageDigest"`
	State       ContainerState `json:"state"`
	ExitedAt    *time.Time     `json:"exitedAt,omitempty"`
	ExitStatus  uint32         `json:"exitStatus"`
	Kind        string         `json:"kind"` // sandbox, container, or native
	PodUID      string         `json:"podUID,omitempty"`
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

// NewReport renders s as of now.
func NewReport(s *State, now time.Time) Report {
	r := Report{Synced: s.Synced, Seq: s.Seq, At: now,
		Images: []ImageReport{}, Containers: []ContainerReport{}, Pods: []PodReport{}}
	for _, d := range slices.Sorted(maps.Keys(s.Images)) {
		img := s.Images[d]
		r.Images = append(r.Images, ImageReport{
			Digest: d, Names: slices.Sorted(maps.Keys(img.Names)), Size: img.Size,
			FirstSeen: img.FirstSeen, LastUsed: s.LastUsed(img, now),
			Users: append([]string{}, s.ImageUsers(img)...), Pinned: img.Pinned(),
		})
	}
	for _, id := range slices.Sorted(maps.Keys(s.Containers)) {
		c := s.Containers[id]
		kind := c.CRIKind
		if kind == "" {
			kind = "native"
		}
		cr := ContainerReport{ID: id, Image: c.Image, ImageDigest: c.ImageDigest, State: c.State,
			ExitStatus: c.ExitStatus, Kind: kind, PodUID: c.PodUID, EvictUnit: c.EvictUnit()}
		if c.State == StateExited {
			t := c.ExitedAt
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
	return r
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
