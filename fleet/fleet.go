// Package fleet is the fleet view's model: it folds the CloudEvents the
// agents publish into one state per node and a tail of recent actions, and
// reads the table as of a given time. It does no I/O: the caller connects
// to NATS, feeds it events and prints what it reads.
package fleet

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

// Window is the span of the per-node totals of a Row: bytes freed and
// failures in the last Window before now.
const Window = time.Hour

// keep is how long a sample stays after the newest event of its node: no
// later now can put an older one inside a Window.
const keep = 2 * Window

// Fleet is the fleet as the events tell it: one state per node and the
// latest actions. It is not safe for concurrent use: one goroutine owns it.
type Fleet struct {
	nodes   map[string]*node // by event source
	tail    []TailLine       // newest last, at most maxTail
	maxTail int
	regrets regretTally // image.regretted, by cluster and image (regret.go)
}

// node is what the events say about one node.
type node struct {
	cluster, name string
	// From the latest heartbeat.
	hasDisk          bool
	diskUsagePercent int
	images           int
	outbox           int
	natsMode         string
	lastHeartbeat    time.Time
	outboxGrowing    bool // the last two figures rose
	// started is the newest agent.started, firstHeard the oldest event or
	// value seen: a node is starting until a heartbeat follows them.
	started, firstHeard time.Time
	// From the node's last value (status stream) only.
	version     string
	high        int           // image GC high threshold, 0 unknown
	interval    time.Duration // heartbeat interval, 0 unknown
	reclaimable int64         // -1 unknown
	synced      bool
	// From gc.completed and gc.failed.
	lastGC       time.Time
	lastGCResult string
	freed        []sample // bytes freed per pass, by pass end
	failures     []time.Time
	removed      map[string]int // kind -> removals seen
}

type sample struct {
	at    time.Time
	bytes int64
}

// TailLine is one action in the tail, as an operator reads it.
type TailLine struct {
	At   time.Time
	Node string
	Type string // kind.action
	// Subject names the object: an image by its tags and short digest, a
	// CRI container by pod and name, else the CloudEvent's subject; prefixed
	// with the containerd namespace when it is not CRI's.
	Subject string
	Reason  string // why it was removed or skipped
	Trigger string // what started a GC pass
	Bytes   int64  // freed (measured) or else estimated; 0 unknown
	// Measured says Bytes is what statfs saw freed, not the estimate.
	Measured bool
	Error    string
	// DryRun marks the action of a dry run: a *.skipped is what it would
	// have removed (Reason the removal's), a gc.* a pass that deleted nothing.
	DryRun bool
}

// Row is one node of the fleet table as of a given time.
type Row struct {
	Cluster, Node    string
	DiskUsagePercent int // -1 unknown
	Images           int // -1 unknown
	LastGC           time.Time
	LastGCResult     string        // completed or failed
	FreedLastHour    int64         // bytes freed by the passes that ended in the Window
	FailuresLastHour int           // failed passes and deletes in the Window
	HeartbeatAge     time.Duration // -1 never
	Outbox           int
	OutboxGrowing    bool // the outbox grew between the last two heartbeats
	NATSMode         string
	Removed          map[string]int // kind -> removals seen
	// Starting says no heartbeat came since the node's agent started (or
	// since it was first heard of), for less than 3 heartbeat intervals: it
	// is not stale yet. After that, without a heartbeat, it is.
	Starting bool
	// From the node's last value; zero when only events were seen.
	Version          string
	HighThreshold    int           // 0 unknown
	Interval         time.Duration // heartbeat interval, 0 unknown
	ReclaimableBytes int64         // -1 unknown
	Synced           bool
}

// New returns an empty fleet whose tail keeps the newest maxTail actions.
func New(maxTail int) *Fleet {
	return &Fleet{nodes: map[string]*node{}, maxTail: maxTail, regrets: newRegretTally()}
}

// Apply folds one event into the fleet. Events arrive in any order
// (replayed and live ones interleave): the newest heartbeat wins whatever
// comes after it. Events of unknown types still go into the tail; data
// that does not fit its type's view is read as far as it fits.
func (f *Fleet) Apply(ev natsbus.CloudEvent) {
	n := f.nodes[ev.Source]
	if n == nil {
		cluster, name := SplitSource(ev.Source)
		n = f.newNode(ev.Source, cluster, name)
	}
	kind, action := SplitType(ev.Type)
	n.heard(ev.Time)
	if kind == schema.KindAgent && action == actionStarted && ev.Time.After(n.started) {
		n.started = ev.Time
	}
	line := TailLine{At: ev.Time, Node: n.name, Type: kind + "." + action, Subject: ev.Subject}
	data, _ := Decode(ev) // a payload of another shape is read as far as it fits
	switch d := data.(type) {
	case *Heartbeat:
		n.heartbeat(ev.Time, d)
		return // heartbeats stay out of the tail
	case *GCEvent:
		if action == actionCompleted || action == actionFailed {
			n.pass(ev.Time, action, d.FreedBytes)
		}
		line.Trigger, line.Bytes, line.Error = d.Trigger, cmp.Or(d.FreedBytes, d.EstimatedBytes), d.Error
		line.Measured, line.DryRun = d.FreedBytes != 0, d.DryRun
	case *RegretEvent:
		line.Subject = inNamespace(d.Namespace, imageLabel(d.Names, cmp.Or(d.Digest, ev.Subject)))
		line.Reason, line.Trigger, line.Bytes = "back after "+(time.Duration(d.ReturnAfterSeconds)*time.Second).String(), d.Trigger, d.Bytes
		f.regrets.add(ev.ID, n.cluster, n.name, d)
	case *ImageEvent:
		line.Subject = inNamespace(d.Namespace, imageLabel(d.Names, cmp.Or(d.Digest, ev.Subject)))
		line.Reason, line.Bytes, line.Measured = string(d.Reason), cmp.Or(d.Freed, d.Size), d.Freed != 0
		if d.DryRun && d.Reason == schema.ReasonDryRun {
			line.Reason, line.DryRun = string(d.Rule), true // what the removal's reason would be
		}
	case *ContainerEvent:
		line.Subject = inNamespace(d.Namespace, containerLabel(ev.Subject, d.PodNamespace, d.PodName, d.ContainerName))
		line.Reason, line.DryRun = string(d.Reason), d.DryRun
	case *LogEvent:
		line.Reason, line.Bytes, line.Error, line.Measured = string(d.Reason), d.Bytes, d.Error, d.Bytes != 0
		line.DryRun = d.DryRun
	case *StateReset:
		line.Error = d.Error
	}
	if action == schema.ActionRemoved {
		n.removed[kind]++
	}
	if action == actionFailed || (action == schema.ActionSkipped && strings.Contains(line.Reason, "fail")) {
		n.failures = append(n.failures, ev.Time)
	}
	f.tail = append(f.tail, line)
	// Replayed and live events may interleave across nodes: keep time order.
	slices.SortStableFunc(f.tail, func(a, b TailLine) int { return a.At.Compare(b.At) })
	if len(f.tail) > f.maxTail {
		f.tail = slices.Delete(f.tail, 0, len(f.tail)-f.maxTail)
	}
	// Forget what can no longer be in a Window of any later now.
	n.freed = slices.DeleteFunc(n.freed, func(s sample) bool { return ev.Time.Sub(s.at) > keep })
	n.failures = slices.DeleteFunc(n.failures, func(t time.Time) bool { return ev.Time.Sub(t) > keep })
}

// heartbeat takes the figures of a heartbeat sent at t unless a newer one
// was seen.
func (n *node) heartbeat(t time.Time, d *Heartbeat) {
	if !t.After(n.lastHeartbeat) {
		return
	}
	n.lastHeartbeat = t
	if d.DiskUsagePercent != nil {
		n.hasDisk, n.diskUsagePercent = true, *d.DiskUsagePercent
	}
	if d.Images != nil {
		n.images = *d.Images
	}
	n.outboxGrowing = n.outbox > 0 && d.Outbox > n.outbox
	n.outbox, n.natsMode = d.Outbox, d.NATSMode
}

// heard notes that the node said something at t.
func (n *node) heard(t time.Time) {
	if n.firstHeard.IsZero() || t.Before(n.firstHeard) {
		n.firstHeard = t
	}
}

// starting says the node has sent no heartbeat since its agent started
// (or since it was first heard of), and that this is less than 3 of its
// heartbeat intervals before now.
func (n *node) starting(now time.Time) bool {
	since := n.started
	if since.IsZero() {
		since = n.firstHeard
	}
	return !since.IsZero() && n.lastHeartbeat.Before(since) && now.Sub(since) <= staleAfter*cmp.Or(n.interval, DefaultInterval)
}

func (f *Fleet) newNode(source, cluster, name string) *node {
	n := &node{cluster: cluster, name: name, removed: map[string]int{}, reclaimable: -1}
	f.nodes[source] = n
	return n
}

// pass records a GC pass that ended at t with result (completed or
// failed) and freed bytes.
func (n *node) pass(t time.Time, result string, freed int64) {
	if !t.Before(n.lastGC) {
		n.lastGC, n.lastGCResult = t, result
	}
	n.freed = append(n.freed, sample{t, freed})
}

// Rows returns the table as of now, one row per node ordered by cluster and
// node; the totals count what happened in the Window up to now.
func (f *Fleet) Rows(now time.Time) []Row {
	out := make([]Row, 0, len(f.nodes))
	from := now.Add(-Window)
	in := func(t time.Time) bool { return !t.Before(from) && !t.After(now) }
	for _, n := range f.nodes {
		r := Row{Cluster: n.cluster, Node: n.name, DiskUsagePercent: -1, Images: -1, LastGC: n.lastGC,
			LastGCResult: n.lastGCResult, HeartbeatAge: -1, Outbox: n.outbox, OutboxGrowing: n.outboxGrowing, NATSMode: n.natsMode,
			Removed: maps.Clone(n.removed), Version: n.version, HighThreshold: n.high, Interval: n.interval,
			ReclaimableBytes: n.reclaimable, Synced: n.synced, Starting: n.starting(now)}
		if n.hasDisk {
			r.DiskUsagePercent = n.diskUsagePercent
		}
		if !n.lastHeartbeat.IsZero() {
			r.Images = n.images
			r.HeartbeatAge = max(now.Sub(n.lastHeartbeat), 0)
		}
		for _, s := range n.freed {
			if in(s.at) {
				r.FreedLastHour += s.bytes
			}
		}
		for _, t := range n.failures {
			if in(t) {
				r.FailuresLastHour++
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Row) int { return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Node, b.Node)) })
	return out
}

// Tail returns a copy of the newest actions, oldest first.
func (f *Fleet) Tail() []TailLine {
	return slices.Clone(f.tail)
}

// SplitSource reads a CloudEvent source gcagent/<cluster>/<node>; the node
// may contain '/'. A source of another form has cluster "?".
func SplitSource(src string) (cluster, node string) {
	rest, ok := strings.CutPrefix(src, "gcagent/")
	if !ok {
		return "?", src
	}
	cluster, node, ok = strings.Cut(rest, "/")
	if !ok {
		return "?", rest
	}
	return cluster, node
}
