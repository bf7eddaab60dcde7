package kubeletdiff

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// A world is one node's pods, sandboxes and containers at one instant, and
// the three policy flags; both sides decide it.
type world struct {
	now    time.Time
	pods   []*pod
	minAge time.Duration
	maxPer int // --maximum-dead-containers-per-container
	maxAll int // --maximum-dead-containers
}

type pod struct {
	uid, name, namespace string
	// deleted: gone from the API server and terminated (no sandbox
	// ready, nothing running): the kubelet's ShouldPodContentBeRemoved;
	// for gcagent, its pod log dir is gone.
	deleted    bool
	sandboxes  []*sandbox // oldest first
	containers []*container
}

type sandbox struct {
	id      string
	created time.Time
	ready   bool
	exited  time.Time // when it stopped; zero while ready
}

type state int

const (
	running state = iota
	exited
	neverStarted // created, its start failed
)

func (s state) String() string { return [...]string{"running", "exited", "never-started"}[s] }

type container struct {
	id, name, sandbox string
	attempt           int
	created, exited   time.Time // exited: zero unless exited
	state             state
}

// generate makes world i of the run seeded with seed: 1 to 6 pods, some
// deleted; 1 to 3 sandboxes each (only a live pod's newest may be ready);
// 1 to 3 container names each with 1 to 4 attempts spread over the
// sandboxes; attempts exited, never started, and the newest in a ready
// sandbox running; the three flags across their ranges. Times are whole
// seconds before now, so the kubelet's clock, read a moment later, sees
// the same ages.
func generate(seed uint64, i int, now time.Time) *world {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	secs := func(lo, hi int) time.Duration { return time.Duration(lo+r.IntN(hi-lo+1)) * time.Second }
	w := &world{
		now:    now,
		minAge: []time.Duration{0, 0, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour}[r.IntN(6)],
		maxPer: pick(-1, 0, 1, 1, 1, 2, 3),
		maxAll: pick(-1, -1, 0, 1, 2, 3, 4, 6, 9, 13),
	}
	n := 0
	id := func(kind string) string {
		n++
		return fmt.Sprintf("%s%03d-%d", kind, n, i)
	}
	for p := range 1 + r.IntN(6) {
		pd := &pod{uid: fmt.Sprintf("uid-%d-%d", i, p), name: fmt.Sprintf("pod-%d", p), namespace: "default", deleted: r.IntN(3) == 0}
		w.pods = append(w.pods, pd)
		// Sandboxes: the pod started up to 3h ago, each new sandbox after
		// the previous one stopped.
		t := now.Add(-secs(600, 3*3600))
		for s := range 1 + r.IntN(3) {
			if s > 0 {
				if t = t.Add(secs(60, 1800)); t.After(now.Add(-2 * time.Second)) {
					break
				}
			}
			pd.sandboxes = append(pd.sandboxes, &sandbox{id: id("sb"), created: t})
		}
		last := len(pd.sandboxes) - 1
		for s, sb := range pd.sandboxes {
			if s == last && !pd.deleted && r.IntN(5) < 3 {
				sb.ready = true
				continue
			}
			end := now
			if s < last {
				end = pd.sandboxes[s+1].created
			}
			sb.exited = between(r, sb.created, end)
		}
		for c := range 1 + r.IntN(3) {
			name := fmt.Sprintf("ctr-%d", c)
			attempts := 1 + r.IntN(4)
			// Attempts run one after another, each in the same sandbox as
			// the one before or a later one.
			s := r.IntN(len(pd.sandboxes))
			prev := time.Time{}
			for a := range attempts {
				if a > 0 && s < last && r.IntN(2) == 0 {
					s++
				}
				sb := pd.sandboxes[s]
				lo := later(sb.created.Add(time.Second), prev.Add(time.Second))
				hi := now.Add(-time.Second)
				if !sb.ready {
					hi = sb.exited
				}
				if !lo.Before(hi) {
					break // no room left in this sandbox
				}
				ct := &container{id: id("c"), name: name, sandbox: sb.id, attempt: a, created: between(r, lo, hi)}
				newest := a == attempts-1
				switch {
				case newest && sb.ready && r.IntN(2) == 0:
					ct.state = running
				case r.IntN(8) == 0:
					ct.state = neverStarted
				case newest && sb.ready && r.IntN(3) == 0:
					// The kubelet just created it: a start may be under way.
					ct.state = neverStarted
					ct.created = later(ct.created, now.Add(-secs(1, 90)))
				default:
					ct.state = exited
					end := hi
					if sb.ready {
						end = now
					}
					ct.exited = between(r, ct.created, end)
				}
				pd.containers = append(pd.containers, ct)
				prev = ct.created
				if !ct.exited.IsZero() {
					prev = ct.exited
				}
				if ct.state == running {
					break
				}
			}
		}
	}
	// No two objects are created at the same instant (both sides sort by
	// creation, and the kubelet's sort is not stable): each is made older
	// by its own few microseconds, which moves no age across a whole
	// second, the unit of every age and of MinAge here.
	n = 0
	for _, pd := range w.pods {
		for _, sb := range pd.sandboxes {
			n++
			sb.created = sb.created.Add(-time.Duration(n) * time.Microsecond)
		}
		for _, c := range pd.containers {
			n++
			c.created = c.created.Add(-time.Duration(n) * time.Microsecond)
		}
	}
	return w
}

// between is a whole second in [lo, hi] (lo if hi is not after it).
func between(r *rand.Rand, lo, hi time.Time) time.Time {
	d := int(hi.Sub(lo) / time.Second)
	if d <= 0 {
		return lo
	}
	return lo.Add(time.Duration(r.IntN(d+1)) * time.Second)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
