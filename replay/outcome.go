package replay

import (
	"math/bits"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// side accounts for one column of a Result.
type side struct {
	out       Outcome
	dels      []Deletion
	pending   map[key]int // deletions not returned yet: index in dels
	returns   []time.Duration
	lastT     time.Time
	usage     int     // usage now, percent
	free      float64 // free share now, percent
	freeInt   float64 // ∫ free dt, percent·seconds
	span      float64 // seconds accounted
	high      int
	passSeen  bool // a removal of the current pass was counted
	sampledAt bool
	price     PullCost // what a re-pull costs in time
}

// simDisk is the simulated node's disk: the real one as last measured,
// less what the simulated node holds beyond it.
func (s *sim) simDisk() trace.Disk {
	avail := int64(s.obs.Available) - s.delta
	avail = min(max(avail, 0), int64(s.obs.Capacity))
	return trace.Disk{Capacity: s.obs.Capacity, Available: uint64(avail)}
}

// account integrates both sides' usage up to t.
func (s *sim) account(t time.Time) {
	for _, sd := range []*side{&s.rec, &s.rep} {
		if !sd.sampledAt || !t.After(sd.lastT) {
			continue
		}
		dt := t.Sub(sd.lastT)
		if sd.usage >= sd.high {
			sd.out.AboveHigh += dt
		}
		sd.freeInt += sd.free * dt.Seconds()
		sd.span += dt.Seconds()
		sd.lastT = t
	}
}

// sample takes both sides' usage at t (after account(t)).
func (s *sim) sample(t time.Time) {
	if !s.hasObs || s.obs.Capacity == 0 {
		return
	}
	for _, x := range []struct {
		sd *side
		d  trace.Disk
	}{{&s.rec, s.obs}, {&s.rep, s.simDisk()}} {
		sd := x.sd
		if !sd.sampledAt {
			sd.sampledAt, sd.lastT = true, t
		}
		sd.usage = x.d.Usage()
		sd.free = 100 * float64(min(x.d.Available, x.d.Capacity)) / float64(x.d.Capacity)
		sd.out.PeakUsage = max(sd.out.PeakUsage, sd.usage)
	}
}

// deleted records a deletion by this side's image GC.
func (sd *side) deleted(k key, d Deletion) {
	sd.out.Deletions++
	sd.out.DeletedBytes += d.Size
	sd.pending[k] = len(sd.dels)
	sd.dels = append(sd.dels, d)
}

// returned records that image k is needed again at t: a re-pull if this
// side's image GC deleted it.
func (sd *side) returned(k key, t time.Time) {
	i, ok := sd.pending[k]
	if !ok {
		return
	}
	delete(sd.pending, k)
	d := &sd.dels[i]
	d.Returned = t
	sd.out.Repulls++
	sd.out.RepulledBytes += d.Size
	sd.out.RepullTime += sd.price.Of(d.Names, d.Size)
	sd.returns = append(sd.returns, t.Sub(d.T))
}

func (s *sim) finish() Result {
	s.advance(s.to)
	s.account(s.to)
	s.dryRunUntil(s.to, false)
	res := Result{From: s.from, To: s.to, Records: s.n, Images: len(s.size), Capacity: s.obs.Capacity,
		FootprintRatio: s.ratio, Policy: TraceOf(s.policy, s.o.Order), RecordedPolicy: s.recorded, DryRun: s.dryRun,
		PullCost: s.rep.price}
	for _, x := range []struct {
		sd  *side
		out *Outcome
	}{{&s.rec, &res.Recorded}, {&s.rep, &res.Replayed}} {
		x.sd.out.MedianReturn = median(x.sd.returns)
		if x.sd.span > 0 {
			x.sd.out.MeanFree = x.sd.freeInt / x.sd.span
		}
		if s.o.Detail {
			x.sd.out.Deleted = x.sd.dels
		}
		*x.out = x.sd.out
	}
	return res
}

func gcDisk(d trace.Disk, known bool) gc.DiskStats {
	if !known {
		return gc.DiskStats{}
	}
	return gc.DiskStats{CapacityBytes: d.Capacity, AvailableBytes: d.Available}
}

// lowReached is the executor's test: usage at or below low percent, in the
// kubelet's arithmetic.
func lowReached(d trace.Disk, low int) bool {
	if d.Capacity == 0 {
		return false
	}
	hi, lo := bits.Mul64(d.Capacity, uint64(100-low))
	q, _ := bits.Div64(hi, lo, 100)
	return min(d.Available, d.Capacity) >= q
}

// earliest lowers *t to c when c is earlier or *t is unset.
func earliest(t *time.Time, c time.Time) {
	if t.IsZero() || c.Before(*t) {
		*t = c
	}
}
