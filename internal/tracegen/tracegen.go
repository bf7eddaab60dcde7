// Package tracegen generates the usage trace (package trace) of a busy
// node, for the replay's tests and benchmarks: images whose popularity
// is skewed the way registry studies report it (a Zipf law over images:
// a few are pulled by most pods, most by few), sizes from tens of MiB to
// GiBs, versions that come and go, pods that start and stop, on a disk
// that image GC keeps between the kubelet's thresholds. It is a model,
// not a measurement: its parameters are stated (Params) and every
// figure made from it says which.
package tracegen

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gcagent/gcagent/trace"
)

// Params describe the node and its workload. Zero fields take
// DefaultParams' values.
type Params struct {
	Seed   uint64
	Start  time.Time
	Days   int // the trace's window
	Images int // distinct images (versions) over the window and the warm-up
	// Zipf is the exponent of popularity over images: the image of rank r
	// is used in proportion to r^-Zipf.
	Zipf float64
	// Runs is about how many containers start over the window.
	Runs int
	// MedianSize is the median image size (log-normal, sigma SizeSigma),
	// kept within MinSize..MaxSize.
	MedianSize, MinSize, MaxSize int64
	SizeSigma                    float64
	// MeanLife is the mean time an image version stays in use before a
	// newer one replaces it (exponential).
	MeanLife time.Duration
	// MedianRun is the median time a container holds its image
	// (log-normal, sigma 1.5).
	MedianRun time.Duration
	// Capacity is the image filesystem's size; Other the bytes on it that
	// are not images.
	Capacity, Other uint64
	// The real node's image GC: the kubelet's LRU with these thresholds
	// and minimum age.
	High, Low int
	MinAge    time.Duration
	// Warmup runs before the window so that it starts from a full node.
	Warmup time.Duration
	// Declared are workloads a cluster declares, beside the busy mix
	// (none when zero; DeclaredParams has some).
	Declared Workloads
}

// Workloads are the workloads whose images a cluster keep list holds
// (declared.go): each has an image of its own, sized as the busy mix's.
type Workloads struct {
	// CronJobs run their image every hour, at a minute of their own, for
	// 2 to 10 minutes.
	CronJobs int
	// ScaleToZero workloads hold their image by day (from 08:00 to 20:00
	// UTC, each start and end within half an hour of that) and scale to
	// zero by night.
	ScaleToZero int
	// Rollbacks are services that run v1 from the start, roll out v2 at a
	// time in the window's first half and, 1 to 5 days later (within the
	// window), roll back to v1, which then runs to the end.
	Rollbacks int
}

// DefaultParams are a busy node's month: 10,000 images, Zipf 1.0,
// about 250,000 containers (one every ten seconds), sizes around 300 MiB
// (20 MiB to 8 GiB), versions living 10 days on average, containers 20
// minutes (median), on a 500 GiB image filesystem with 50 GiB of other
// data, under the kubelet's 85/80 and 2 minutes.
func DefaultParams() Params {
	return Params{Seed: 1, Start: time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC), Days: 30, Images: 10000, Zipf: 1.0,
		Runs: 250000, MedianSize: 300 << 20, MinSize: 20 << 20, MaxSize: 8 << 30, SizeSigma: 1.0,
		MeanLife: 10 * 24 * time.Hour, MedianRun: 20 * time.Minute, Capacity: 500 << 30, Other: 50 << 30,
		High: 85, Low: 80, MinAge: 2 * time.Minute, Warmup: 3 * 24 * time.Hour}
}

func (p Params) withDefaults() Params {
	d := DefaultParams()
	if p.Start.IsZero() {
		p.Start = d.Start
	}
	p.Days = cmp.Or(p.Days, d.Days)
	p.Images = cmp.Or(p.Images, d.Images)
	p.Zipf = cmp.Or(p.Zipf, d.Zipf)
	p.Runs = cmp.Or(p.Runs, d.Runs)
	p.MedianSize, p.MinSize, p.MaxSize = cmp.Or(p.MedianSize, d.MedianSize), cmp.Or(p.MinSize, d.MinSize), cmp.Or(p.MaxSize, d.MaxSize)
	p.SizeSigma = cmp.Or(p.SizeSigma, d.SizeSigma)
	p.MeanLife, p.MedianRun = cmp.Or(p.MeanLife, d.MeanLife), cmp.Or(p.MedianRun, d.MedianRun)
	p.Capacity, p.Other = cmp.Or(p.Capacity, d.Capacity), cmp.Or(p.Other, d.Other)
	p.High, p.Low, p.MinAge = cmp.Or(p.High, d.High), cmp.Or(p.Low, d.Low), cmp.Or(p.MinAge, d.MinAge)
	p.Warmup = cmp.Or(p.Warmup, d.Warmup)
	return p
}

// DeclaredParams are DefaultParams with 20 CronJobs, 20 scale-to-zero
// workloads and 10 rollbacks beside the busy mix.
func DeclaredParams() Params {
	p := DefaultParams()
	p.Declared = Workloads{CronJobs: 20, ScaleToZero: 20, Rollbacks: 10}
	return p
}

// image is one version.
type image struct {
	digest, name string
	size, fp     int64 // size as the kubelet counts it; footprint on disk
	weight       float64
	born, dies   time.Time

	present   bool
	firstSeen time.Time
	lastUsed  time.Time
	users     int
}

// event is a container starting (start) or stopping on image img.
type event struct {
	t     time.Time
	img   int
	start bool
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if !e[i].t.Equal(e[j].t) {
		return e[i].t.Before(e[j].t)
	}
	return !e[i].start && e[j].start // stops first
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// Generate returns the trace of the window (canonical: time order,
// removals paired), starting with its base: the node as the warm-up left
// it.
func Generate(p Params) []trace.Record {
	p = p.withDefaults()
	rng := rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))
	begin := p.Start.Add(-p.Warmup)
	end := p.Start.Add(time.Duration(p.Days) * 24 * time.Hour)
	imgs := make([]image, p.Images)
	ranks := rng.Perm(p.Images)
	for i := range imgs {
		size := int64(float64(p.MedianSize) * math.Exp(p.SizeSigma*rng.NormFloat64()))
		size = min(max(size, p.MinSize), p.MaxSize)
		// Births spread over warm-up and window; a tenth are there from
		// the start (base images, long-lived services).
		span := end.Sub(begin)
		born := begin
		if rng.Float64() >= 0.1 {
			born = begin.Add(time.Duration(rng.Float64() * float64(span)))
		}
		life := time.Duration(rng.ExpFloat64() * float64(p.MeanLife))
		imgs[i] = image{
			digest: fmt.Sprintf("sha256:%064x", p.Seed<<32|uint64(i)),
			name:   fmt.Sprintf("registry.example/team-%d/app-%d:v%d", i%97, i%1499, i),
			size:   size, fp: int64(float64(size) * (1.5 + rng.Float64())),
			weight: math.Pow(float64(ranks[i]+1), -p.Zipf),
			born:   born, dies: born.Add(life),
		}
	}
	// Each version runs at a rate in proportion to its popularity while it
	// lives, and once when it is rolled out: about p.Runs over the window.
	var mass float64
	window := float64(end.Sub(p.Start))
	for _, im := range imgs {
		from, to := later(im.born, p.Start), earlier(im.dies, end)
		if to.After(from) {
			mass += im.weight * float64(to.Sub(from)) / window
		}
	}
	rate := float64(p.Runs) / mass / window // runs per ns per unit of weight
	var evs events
	run := func(i int, t time.Time) {
		d := time.Duration(float64(p.MedianRun) * math.Exp(1.5*rng.NormFloat64()))
		d = min(max(d, 30*time.Second), 72*time.Hour)
		evs = append(evs, event{t, i, true}, event{t.Add(d), i, false})
	}
	for i, im := range imgs {
		if im.born.After(begin) {
			run(i, im.born)
		}
		to := earlier(im.dies, end)
		for t := im.born; ; {
			t = t.Add(time.Duration(rng.ExpFloat64() / (rate * im.weight)))
			if !t.Before(to) {
				break
			}
			run(i, t)
		}
	}
	imgs, evs = declare(p, imgs, evs, begin, end)
	heap.Init(&evs)
	n := &node{p: p, imgs: imgs}
	for evs.Len() > 0 {
		e := heap.Pop(&evs).(event)
		if !e.t.Before(end) {
			break
		}
		n.at(e)
	}
	// The window starts with the node as the warm-up left it.
	var before, after []trace.Record
	for _, r := range n.recs {
		if r.T.Before(p.Start) {
			before = append(before, r)
		} else {
			after = append(after, r)
		}
	}
	base := trace.Fold(nil, before, p.Start)
	for i := range base {
		base[i].T = p.Start
	}
	return append(base, after...)
}

// node is the real node: it pulls what a container needs, and its image
// GC (the kubelet's) deletes the least recently used unused images past
// the minimum age when usage reaches the high threshold, down to the low
// one. It records what the agent would.
type node struct {
	p       Params
	imgs    []image
	present []int // indexes of the images on disk
	used    int64 // image bytes on disk
	pct     int   // usage last recorded
	recs    []trace.Record
	began   bool
}

func (n *node) disk() trace.Disk {
	used := min(n.p.Other+uint64(n.used), n.p.Capacity)
	return trace.Disk{Capacity: n.p.Capacity, Available: n.p.Capacity - used}
}

func (n *node) add(r trace.Record) { n.recs = append(n.recs, r) }

// sample records the disk when its usage moved by a percent, as the
// agent does.
func (n *node) sample(t time.Time, trigger string) {
	d := n.disk()
	if u := d.Usage(); u != n.pct || trigger != "" {
		n.pct = u
		n.add(trace.Record{T: t, Ev: trace.KindDisk, Disk: &d, Trigger: trigger})
	}
}

func (n *node) at(e event) {
	if !n.began {
		n.began = true
		n.add(trace.Record{T: e.t, Ev: trace.KindPolicy, Policy: &trace.Policy{High: n.p.High, Low: n.p.Low,
			MinAge: trace.Duration(n.p.MinAge)}})
	}
	im := &n.imgs[e.img]
	if !e.start {
		if !im.present || im.users == 0 {
			return
		}
		im.users--
		if im.users == 0 {
			im.lastUsed = e.t
			n.add(trace.Record{T: e.t, Ev: trace.KindIdle, NS: "k8s.io", Digest: im.digest})
		}
		return
	}
	if !im.present {
		im.present, im.firstSeen, im.lastUsed, im.users = true, e.t, time.Time{}, 0
		n.present = append(n.present, e.img)
		n.used += im.fp
		n.add(trace.Record{T: e.t, Ev: trace.KindImage, NS: "k8s.io", Digest: im.digest, Names: []string{im.name}, Size: im.size})
		n.sample(e.t, "")
		n.gc(e.t)
	}
	im.users++
	if im.users == 1 {
		im.lastUsed = e.t
		n.add(trace.Record{T: e.t, Ev: trace.KindUse, NS: "k8s.io", Digest: im.digest})
	}
}

// gc is the kubelet's image GC at t.
func (n *node) gc(t time.Time) {
	d := n.disk()
	if d.Usage() < n.p.High {
		return
	}
	n.sample(t, "disk")
	var cands []int
	for _, i := range n.present {
		im := &n.imgs[i]
		if im.users == 0 && !t.Before(im.firstSeen.Add(n.p.MinAge)) {
			cands = append(cands, i)
		}
	}
	slices.SortFunc(cands, func(a, b int) int {
		x, y := &n.imgs[a], &n.imgs[b]
		return cmp.Or(x.lastUsed.Compare(y.lastUsed), x.firstSeen.Compare(y.firstSeen), cmp.Compare(x.digest, y.digest))
	})
	low := n.p.Capacity * uint64(100-n.p.Low) / 100
	for _, i := range cands {
		if n.disk().Available >= low {
			break
		}
		im := &n.imgs[i]
		im.present = false
		n.used -= im.fp
		n.add(trace.Record{T: t, Ev: trace.KindRemoved, NS: "k8s.io", Digest: im.digest, Names: []string{im.name}, Size: im.size,
			By: trace.ByAgent, Rule: "space", Trigger: "disk", Freed: im.fp})
	}
	n.present = slices.DeleteFunc(n.present, func(i int) bool { return !n.imgs[i].present })
	n.sample(t, "")
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
