package tracegen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gcagent/gcagent/declared"
)

// The declared workloads (Params.Declared): CronJobs, scale-to-zero
// workloads and rollbacks, each on images of its own, their runs drawn
// from a random stream of their own so that the busy mix is the same with
// them or without.

// workloadImage is one image a declared workload names.
type workloadImage struct {
	w      declared.Workload
	name   string
	digest string
}

// workloadImages are the images p's declared workloads name, in a fixed
// order: each CronJob's, each scale-to-zero workload's, each rollback's
// v1 then v2.
func workloadImages(p Params) []workloadImage {
	var out []workloadImage
	add := func(kind, ns, name, image string) {
		out = append(out, workloadImage{w: declared.Workload{Kind: kind, Namespace: ns, Name: name}, name: image,
			digest: fmt.Sprintf("sha256:%064x", p.Seed<<32|1<<31|uint64(len(out)))})
	}
	for i := range p.Declared.CronJobs {
		add("CronJob", "batch", fmt.Sprintf("report-%d", i), fmt.Sprintf("registry.example/batch/report-%d:v1", i))
	}
	for i := range p.Declared.ScaleToZero {
		add("Deployment", "office", fmt.Sprintf("desk-%d", i), fmt.Sprintf("registry.example/office/desk-%d:v1", i))
	}
	for i := range p.Declared.Rollbacks {
		// The Deployment's current ReplicaSet and the one a rollback
		// returns to (within revisionHistoryLimit): both declared.
		add("Deployment", "shop", fmt.Sprintf("svc-%d", i), fmt.Sprintf("registry.example/shop/svc-%d:v1", i))
		add("Deployment", "shop", fmt.Sprintf("svc-%d", i), fmt.Sprintf("registry.example/shop/svc-%d:v2", i))
	}
	return out
}

// KeepList is the cluster keep list p's declared workloads make: each
// image they name (a normalized reference) with the workload naming it,
// as gcagent-cluster declares them all along (a CronJob between runs, a
// Deployment at zero replicas, the ReplicaSet a rollback returns to).
func KeepList(p Params) []declared.Entry {
	p = p.withDefaults()
	var out []declared.Entry
	for _, im := range workloadImages(p) {
		out = append(out, declared.Entry{Image: im.name, By: []declared.Workload{im.w}})
	}
	return out
}

// declare adds p's declared workloads' images to imgs and their runs, from
// begin to end, to evs.
func declare(p Params, imgs []image, evs events, begin, end time.Time) ([]image, events) {
	wl := workloadImages(p)
	if len(wl) == 0 {
		return imgs, evs
	}
	rng := rand.New(rand.NewPCG(p.Seed^0x6a09e667f3bcc908, p.Seed))
	first := len(imgs)
	for _, im := range wl {
		size := int64(float64(p.MedianSize) * math.Exp(p.SizeSigma*rng.NormFloat64()))
		size = min(max(size, p.MinSize), p.MaxSize)
		imgs = append(imgs, image{digest: im.digest, name: im.name, size: size, fp: int64(float64(size) * (1.5 + rng.Float64())),
			born: begin, dies: end})
	}
	run := func(i int, from, to time.Time) {
		from, to = later(from, begin), earlier(to, end)
		if to.After(from) {
			evs = append(evs, event{from, i, true}, event{to, i, false})
		}
	}
	i := first
	day := begin.Truncate(24 * time.Hour)
	for range p.Declared.CronJobs {
		minute := time.Duration(rng.IntN(60)) * time.Minute
		for h := begin.Truncate(time.Hour); h.Before(end); h = h.Add(time.Hour) {
			d := 2*time.Minute + time.Duration(rng.Int64N(int64(8*time.Minute)))
			run(i, h.Add(minute), h.Add(minute+d))
		}
		i++
	}
	jitter := func() time.Duration { return time.Duration(rng.Int64N(int64(time.Hour))) - 30*time.Minute }
	for range p.Declared.ScaleToZero {
		for d := day; d.Before(end); d = d.Add(24 * time.Hour) {
			run(i, d.Add(8*time.Hour+jitter()), d.Add(20*time.Hour+jitter()))
		}
		i++
	}
	window := end.Sub(p.Start)
	for range p.Declared.Rollbacks {
		out := p.Start.Add(time.Duration(rng.Float64() * float64(window/2)))
		back := out.Add(24*time.Hour + time.Duration(rng.Float64()*float64(4*24*time.Hour)))
		if limit := out.Add(end.Sub(out) * 3 / 4); back.After(limit) {
			back = limit
		}
		run(i, begin, out)  // v1
		run(i+1, out, back) // v2
		run(i, back, end)   // v1 again: a re-pull if it went
		i += 2
	}
	return imgs, evs
}
