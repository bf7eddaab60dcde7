package fleet

import (
	"cmp"
	"slices"
)

// RegretEvent is the data of image.regretted: an image an agent deleted
// came back on its node within the regret window.
type RegretEvent = schemaImageRegret

// ClusterRegrets is one cluster's regret figures: how many of the images
// its agents deleted came back, of how many removals seen.
type ClusterRegrets struct {
	Cluster string
	Regrets int
	Bytes   int64 // sizes of the regretted images
	Removed int   // image.removed seen of the cluster
	// Rate is Regrets / Removed (0 without removals): the share of deletes
	// that were wrong, the figure that says whether thresholds fit.
	Rate float64
}

// ImageRegrets is one image's regrets across the fleet, by its first
// readable name.
type ImageRegrets struct {
	Image   string
	Regrets int
	Bytes   int64
	Nodes   int // distinct nodes it came back on
	// ReturnAfterSeconds is the shortest time to return seen.
	ReturnAfterSeconds float64
}

// regretTally counts image.regretted events once each (replayed and live
// events may repeat one).
type regretTally struct {
	seen      map[string]bool // event ids
	byCluster map[string]*ClusterRegrets
	byImage   map[string]*imageTally
}

type imageTally struct {
	ImageRegrets
	nodes map[string]bool
}

func newRegretTally() regretTally {
	return regretTally{seen: map[string]bool{}, byCluster: map[string]*ClusterRegrets{}, byImage: map[string]*imageTally{}}
}

func (r *regretTally) add(id, cluster, node string, d *RegretEvent) {
	if r.seen[id] {
		return
	}
	r.seen[id] = true
	c := r.byCluster[cluster]
	if c == nil {
		c = &ClusterRegrets{Cluster: cluster}
		r.byCluster[cluster] = c
	}
	c.Regrets++
	c.Bytes += d.Bytes
	name := imageLabel(d.Names, d.Digest)
	it := r.byImage[name]
	if it == nil {
		it = &imageTally{ImageRegrets: ImageRegrets{Image: name, ReturnAfterSeconds: d.ReturnAfterSeconds}, nodes: map[string]bool{}}
		r.byImage[name] = it
	}
	it.Regrets++
	it.Bytes += d.Bytes
	it.ReturnAfterSeconds = min(it.ReturnAfterSeconds, d.ReturnAfterSeconds)
	it.nodes[cluster+"/"+node] = true
	it.Nodes = len(it.nodes)
}

// ClusterRegrets returns each cluster's regrets and removals, by cluster
// name; a cluster with removals and no regret has a row too.
func (f *Fleet) ClusterRegrets() []ClusterRegrets {
	rows := map[string]*ClusterRegrets{}
	for _, n := range f.nodes {
		r := rows[n.cluster]
		if r == nil {
			r = &ClusterRegrets{Cluster: n.cluster}
			rows[n.cluster] = r
		}
		r.Removed += n.removed["image"]
	}
	for name, c := range f.regrets.byCluster {
		r := rows[name]
		if r == nil {
			r = &ClusterRegrets{Cluster: name}
			rows[name] = r
		}
		r.Regrets, r.Bytes = c.Regrets, c.Bytes
	}
	out := make([]ClusterRegrets, 0, len(rows))
	for _, r := range rows {
		if r.Removed > 0 {
			r.Rate = float64(r.Regrets) / float64(r.Removed)
		}
		if r.Removed > 0 || r.Regrets > 0 {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b ClusterRegrets) int { return cmp.Compare(a.Cluster, b.Cluster) })
	return out
}

// TopRegretted returns the n images regretted most (by count, then
// bytes, then name).
func (f *Fleet) TopRegretted(n int) []ImageRegrets {
	out := make([]ImageRegrets, 0, len(f.regrets.byImage))
	for _, it := range f.regrets.byImage {
		out = append(out, it.ImageRegrets)
	}
	slices.SortFunc(out, func(a, b ImageRegrets) int {
		return cmp.Or(cmp.Compare(b.Regrets, a.Regrets), cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Image, b.Image))
	})
	return out[:min(n, len(out))]
}
