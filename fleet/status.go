package fleet

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/gcagent/gcagent/schema"
)

// ApplyStatus folds a node's last value (schema.NodeStatus, from the
// status stream) into the fleet: its figures replace the heartbeat's
// unless a newer heartbeat was seen; its version, thresholds and interval
// are kept whatever its age.
func (f *Fleet) ApplyStatus(st schema.NodeStatus) {
	source := "gcagent/" + st.Cluster + "/" + st.Node
	n := f.nodes[source]
	if n == nil {
		n = f.newNode(source, st.Cluster, st.Node)
	}
	n.heard(st.At)
	n.version, n.high = st.Version, st.ImageGCHighThreshold
	n.interval = time.Duration(st.HeartbeatIntervalSeconds * float64(time.Second))
	if !st.At.After(n.lastHeartbeat) {
		return
	}
	n.lastHeartbeat = st.At
	if st.DiskError == "" {
		n.hasDisk, n.diskUsagePercent = true, st.DiskUsagePercent
	}
	n.images, n.reclaimable, n.synced = st.Images, st.ReclaimableBytes, st.Synced
	n.outboxGrowing = n.outbox > 0 && st.Outbox > n.outbox
	n.outbox, n.natsMode = st.Outbox, st.NATSMode
	if g := st.LastGC; g != nil && !g.At.Before(n.lastGC) {
		n.lastGC, n.lastGCResult = g.At, actionCompleted
		if g.Error != "" {
			n.lastGCResult = actionFailed
		}
	}
}

// DefaultInterval is the heartbeat interval assumed for a node whose
// last value does not say.
const DefaultInterval = 30 * time.Second

// staleAfter is how many heartbeat intervals without one make a node stale.
const staleAfter = 3

// Look is a node that needs a look, with why, worst first.
type Look struct {
	Row
	Reasons []string
	score   int
}

// Reasons a node needs a look, each with its weight in the order.
const (
	ReasonUnrelievable  = "unrelievable"   // over the high threshold, nothing left GC may delete
	ReasonOverHigh      = "over-high"      // disk usage at or over the high threshold
	ReasonGCFailed      = "gc-failed"      // the last pass failed, or failures in the Window
	ReasonStale         = "stale"          // no heartbeat for 3 intervals (not while starting)
	ReasonOutboxGrowing = "outbox-growing" // events pile up: NATS not reachable or slow
	ReasonNotJetStream  = "nats-degraded"  // publishing in core mode or disconnected
)

var weight = map[string]int{ReasonUnrelievable: 32, ReasonOverHigh: 16, ReasonGCFailed: 8, ReasonStale: 4,
	ReasonOutboxGrowing: 2, ReasonNotJetStream: 1}

// Judge returns why r needs a look as of its HeartbeatAge ("" reasons: it does not).
func Judge(r Row) []string {
	var why []string
	over := r.DiskUsagePercent >= 0 && r.HighThreshold > 0 && r.HighThreshold < 100 && r.DiskUsagePercent >= r.HighThreshold
	if over && r.ReclaimableBytes == 0 && r.Synced {
		why = append(why, ReasonUnrelievable)
	} else if over {
		why = append(why, ReasonOverHigh)
	}
	if r.LastGCResult == actionFailed || r.FailuresLastHour > 0 {
		why = append(why, ReasonGCFailed)
	}
	if !r.Starting && (r.HeartbeatAge < 0 || r.HeartbeatAge > staleAfter*cmp.Or(r.Interval, DefaultInterval)) {
		why = append(why, ReasonStale)
	}
	if r.OutboxGrowing {
		why = append(why, ReasonOutboxGrowing)
	}
	if r.NATSMode != "" && r.NATSMode != "jetstream" {
		why = append(why, ReasonNotJetStream)
	}
	return why
}

// Looks returns the rows that need a look, worst first (by the weight of
// their reasons, then fullest disk, then cluster and node).
func Looks(rows []Row) []Look {
	var out []Look
	for _, r := range rows {
		why := Judge(r)
		if len(why) == 0 {
			continue
		}
		l := Look{Row: r, Reasons: why}
		for _, w := range why {
			l.score += weight[w]
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Look) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(b.DiskUsagePercent, a.DiskUsagePercent),
			cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Node, b.Node))
	})
	return out
}

// Totals sums rows: per cluster and for the fleet.
type Totals struct {
	Nodes         int
	Starting      int            // nodes not yet heard from by a heartbeat since they started
	Clusters      map[string]int // nodes per cluster
	ByReason      map[string]int // nodes per reason
	Outbox        int            // events waiting in the nodes' outboxes
	FreedLastHour int64
	Failures      int
}

// Sum returns the totals of rows and their looks.
func Sum(rows []Row, looks []Look) Totals {
	t := Totals{Nodes: len(rows), Clusters: map[string]int{}, ByReason: map[string]int{}}
	for _, r := range rows {
		t.Clusters[r.Cluster]++
		if r.Starting {
			t.Starting++
		}
		t.Outbox += r.Outbox
		t.FreedLastHour += r.FreedLastHour
		t.Failures += r.FailuresLastHour
	}
	for _, l := range looks {
		for _, w := range l.Reasons {
			t.ByReason[w]++
		}
	}
	return t
}

// String is one line of totals.
func (t Totals) String() string {
	s := fmt.Sprintf("nodes %d in %d clusters", t.Nodes, len(t.Clusters))
	if t.Starting > 0 {
		s += fmt.Sprintf(", starting %d", t.Starting)
	}
	for _, w := range []string{ReasonUnrelievable, ReasonOverHigh, ReasonGCFailed, ReasonStale, ReasonOutboxGrowing, ReasonNotJetStream} {
		if t.ByReason[w] > 0 {
			s += fmt.Sprintf(", %s %d", w, t.ByReason[w])
		}
	}
	return s + fmt.Sprintf(", outbox %d events, failures 1h %d", t.Outbox, t.Failures)
}
