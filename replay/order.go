package replay

import "github.com/gcagent/gcagent/gc"

// gdsf is a Greedy-Dual-Size-Frequency order (Cherkasova, 1998; the
// family FaasCache applies to keeping containers warm): each image's
// worth is H = L + F × C / S, where F is how often a container started
// using it since it arrived, C what deleting it would cost and S what
// deleting it frees (its footprint on disk); L, the inflation, is the
// worth of the last image deleted, so that an image not used for long
// ages below newer ones. H is set at each use and each idle (the end of a
// use). Threshold GC deletes the lowest H first (gc.ImagePolicy.Order).
// C is the time a re-pull takes (OrderGDSF: PullCost), or the bytes it
// fetches (OrderGDSFBytes: its size, which over a footprint in
// proportion to it leaves frequency with aging).
type gdsf struct {
	l      float64
	freq   map[key]float64
	h      map[key]float64
	weight func(key) float64 // C / S
}

func newGDSF(weight func(key) float64) *gdsf {
	return &gdsf{freq: map[key]float64{}, h: map[key]float64{}, weight: weight}
}

var _ gc.ImageOrder = (*gdsf)(nil)

// Rank is the image's worth H; an image never used since it arrived is
// worth L.
func (g *gdsf) Rank(it *gc.ImageItem) float64 {
	if h, ok := g.h[key{it.Namespace, it.Digest}]; ok {
		return h
	}
	return g.l
}

// arrive: image k is (again) on the node, not used yet.
func (g *gdsf) arrive(k key) {
	g.freq[k] = 0
	g.h[k] = g.l
}

// use: a container started holding image k.
func (g *gdsf) use(k key) {
	g.freq[k]++
	g.h[k] = g.l + g.freq[k]*g.weight(k)
}

// idle: the last container holding image k went.
func (g *gdsf) idle(k key) { g.h[k] = g.l + g.freq[k]*g.weight(k) }

// evict: image GC deleted image k; the inflation rises to its worth.
func (g *gdsf) evict(k key) {
	if h := g.h[k]; h > g.l {
		g.l = h
	}
	g.forget(k)
}

// forget: image k left the node without image GC.
func (g *gdsf) forget(k key) {
	delete(g.freq, k)
	delete(g.h, k)
}
