package agent

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
)

// The cluster keep list: the images the cluster's declared workloads name,
// which gcagent-cluster publishes under the keep bucket's keys
// declared.<cluster>.* (a head with the list's state and heartbeat, and
// shards: declared/). The agent watches them with the operator's keys,
// merges them with the operator's patterns, and judges them from evidence:
// known while the head says complete, every shard of its layout is read
// and a heartbeat came within three of its periods; stale (the last
// complete list, saved in the state dir, keeps) while the component
// syncs, cannot read a kind, or stopped saying it is alive; unknown while
// it has never been complete here and is not now. No head is a known
// empty list: never installed, or, once a complete list was read, after
// that list's grace from when the head went (uninstalled, or the bucket
// lost with NATS's store, which the component writes again): meanwhile the
// last complete list keeps, stale, as the component keeps an image whose
// last workload went.

// clusterSkew is how far the component's clock may be from the agent's
// before a heartbeat read at a watch's start counts as older than it is.
const clusterSkew = 30 * time.Second

// clusterSaved is the last complete cluster list the agent read, kept in
// KeepListFile so that it keeps while NATS or the component is away.
type clusterSaved struct {
	Images []declared.ShardImage `json:"images"`
	// At is when it was last complete and alive; By the component's
	// instance that wrote it.
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
	// ReleaseAfterS is the list's grace (its head's); Gone when the head
	// was found gone (zero while there is one).
	ReleaseAfterS float64   `json:"releaseAfterS,omitempty"`
	Gone          time.Time `json:"gone,omitzero"`
}

// releaseAt is when a list whose head went stops keeping.
func (s *clusterSaved) releaseAt() time.Time {
	return s.Gone.Add(time.Duration(s.ReleaseAfterS * float64(time.Second)))
}

// releasing reports whether s is a list whose head went, still keeping
// at now.
func (s *clusterSaved) releasing(now time.Time) bool {
	return s != nil && !s.Gone.IsZero() && now.Before(s.releaseAt())
}

// clusterKeep is the cluster list as the agent read it. fleetKeep's mu
// guards it.
type clusterKeep struct {
	cluster string // the cluster's token in the keys
	head    *declared.Head
	// headAt is when the head was last received (a head read at a watch's
	// start: no later than its own heartbeat plus clusterSkew).
	headAt time.Time
	shards map[string]declared.Shard
	bad    map[string]error // keys whose value is not understood
	// read says a watch of this run delivered the keys' current values.
	read bool
	last *clusterSaved
	// refs is what the list keeps now (reference → who declares it),
	// rebuilt at each change; never changed in place (KeepList shares it).
	refs map[string]string
}

func newClusterKeep(cluster string) *clusterKeep {
	return &clusterKeep{cluster: natsbus.SafeToken(cluster), shards: map[string]declared.Shard{}, bad: map[string]error{}, refs: map[string]string{}}
}

// key is the watch key of the cluster list.
func (c *clusterKeep) key() string { return declared.WatchKeys(c.cluster) }

// owns reports whether a bucket key is one of the cluster list's.
func (c *clusterKeep) owns(key string) bool {
	return strings.HasPrefix(key, declared.KeyPrefix+c.cluster+".")
}

// apply takes a value (or a delete) of one of its keys; live says the
// watch had delivered the current values before (a heartbeat received now
// is one written now). It reports whether what the list keeps changed.
func (c *clusterKeep) apply(u natsbus.KeepUpdate, live bool, now time.Time) bool {
	head, _, _, ok := declared.ParseKey(c.cluster, u.Key)
	if !ok {
		return false // a key of another layout's form, or garbage: nothing of ours
	}
	delete(c.bad, u.Key)
	switch {
	case head && u.Deleted:
		c.head = nil
	case head:
		h, err := declared.DecodeHead(u.Value)
		if err != nil {
			c.bad[u.Key] = err
			break
		}
		c.head = &h
		c.headAt = now
		if !live && !h.Heartbeat.IsZero() && h.Heartbeat.Add(clusterSkew).Before(now) {
			c.headAt = h.Heartbeat.Add(clusterSkew)
		}
	case u.Deleted:
		delete(c.shards, u.Key)
	default:
		s, err := declared.DecodeShard(u.Value)
		if err != nil {
			c.bad[u.Key] = err
			delete(c.shards, u.Key)
			break
		}
		c.shards[u.Key] = s
	}
	return c.rebuild(now)
}

// synced ends a watch's delivery of the current values: keys it did not
// deliver do not exist.
func (c *clusterKeep) synced(seen map[string]bool, now time.Time) bool {
	for key := range c.shards {
		if !seen[key] {
			delete(c.shards, key)
		}
	}
	for key := range c.bad {
		if !seen[key] {
			delete(c.bad, key)
		}
	}
	if !seen[declared.HeadKey(c.cluster)] {
		c.head = nil
	}
	c.read = true
	return c.rebuild(now)
}

// list is the list as assembled from what was read.
func (c *clusterKeep) list() declared.List { return declared.Assemble(c.cluster, c.head, c.shards) }

// fresh reports whether the head's heartbeat came within three periods.
func (c *clusterKeep) fresh(now time.Time) bool {
	every := 30 * time.Second
	if c.head != nil && c.head.HeartbeatEveryS > 0 {
		every = time.Duration(c.head.HeartbeatEveryS * float64(time.Second))
	}
	return now.Sub(c.headAt) < 3*max(every, 5*time.Second)
}

// rebuild makes refs from what is read: the list when it is whole (and,
// then, saves it as the last complete one), else the list read so far
// with the last complete one; once the watch read no head, the last
// complete one for its grace from then, then nothing. It reports whether
// refs, or when the head went, changed.
func (c *clusterKeep) rebuild(now time.Time) bool {
	l := c.list()
	var images []declared.ShardImage
	goneBefore := c.gone()
	switch {
	case c.read && c.head == nil && len(c.bad) == 0:
		// The component's list is gone: its last complete one keeps for
		// its grace from now, then nothing.
		if c.last != nil && c.last.Gone.IsZero() {
			last := *c.last
			last.Gone = now
			c.last = &last
		}
		if c.last.releasing(now) {
			images = c.last.Images
		} else {
			c.last = nil
		}
	case l.Whole() && len(c.bad) == 0 && c.fresh(now):
		images = l.Images
		c.last = &clusterSaved{Images: l.Images, At: now, By: c.head.By, ReleaseAfterS: c.head.ReleaseAfterS}
	default:
		images = l.Images
		if c.last != nil {
			if c.head != nil && !c.last.Gone.IsZero() {
				last := *c.last // a head again: no grace runs
				last.Gone = time.Time{}
				c.last = &last
			}
			images = append(append([]declared.ShardImage{}, c.last.Images...), images...)
		}
	}
	goneChanged := !goneBefore.Equal(c.gone())
	refs := make(map[string]string, len(images))
	for _, im := range images {
		if _, dup := refs[im.Ref]; !dup || len(im.By) > 0 {
			refs[im.Ref] = declared.List{Images: []declared.ShardImage{im}}.Sources(im.Ref)
		}
	}
	if maps.Equal(refs, c.refs) {
		return goneChanged
	}
	c.refs = refs
	return true
}

// gone is when the head of the last complete list was found gone (zero:
// it was not, or there is no such list).
func (c *clusterKeep) gone() time.Time {
	if c.last == nil {
		return time.Time{}
	}
	return c.last.Gone
}

// expire ends the grace of a list whose head went once it is over; it
// reports whether what the list keeps changed.
func (c *clusterKeep) expire(now time.Time) bool {
	if c.read && c.head == nil && c.last != nil && !c.last.Gone.IsZero() && !c.last.releasing(now) {
		return c.rebuild(now)
	}
	return false
}

// input is the list's state at now: known (or nothing to say) with a
// complete, fresh list or none at all; stale while the last complete list
// keeps; unknown while it was never complete here and is not now. Cause
// says why it is not known.
func (c *clusterKeep) input(now time.Time) (gc.InputState, string) {
	if !c.read {
		return gc.InputKnown, "" // the operator's list's state says all: nothing of this run was read
	}
	l := c.list()
	var why string
	switch {
	case len(c.bad) > 0:
		for key, err := range c.bad {
			why = fmt.Sprintf("cluster keep list: value of key %s not understood: %v", key, err)
			break
		}
	case c.head == nil && c.last.releasing(now):
		why = fmt.Sprintf("cluster keep list: no head since %s (gcagent-cluster uninstalled, or NATS lost its store); keeping the last complete list for its grace, until %s",
			c.last.Gone.UTC().Format(time.RFC3339), c.last.releaseAt().UTC().Format(time.RFC3339))
	case c.head == nil:
		return gc.InputKnown, ""
	case c.head.State != declared.Complete:
		why = fmt.Sprintf("cluster keep list %s (%s)", c.head.State, c.head.Reason)
	case l.Missing > 0:
		why = fmt.Sprintf("cluster keep list: %d of its %d shards not read", l.Missing, c.head.Shards)
	case !c.fresh(now):
		why = fmt.Sprintf("cluster keep list: gcagent-cluster (%s) has not said it is alive for %s", c.head.By, now.Sub(c.headAt).Round(time.Second))
	default:
		return gc.InputKnown, ""
	}
	if c.last == nil {
		return gc.InputUnknown, why + "; never complete on this node"
	}
	return gc.InputStale, why + "; keeping the last complete list"
}

// state names the list's state for /readyz and the gauge: absent,
// syncing, incomplete, stale, complete, or not-read.
func (c *clusterKeep) state(now time.Time) string {
	switch {
	case !c.read && c.last != nil:
		return "saved"
	case !c.read:
		return "not-read"
	case c.head == nil && c.last != nil && !c.last.Gone.IsZero():
		return "gone" // keeping the last complete list for its grace
	case c.head == nil:
		return "absent"
	}
	if s, _ := c.input(now); s == gc.InputKnown {
		return string(declared.Complete)
	}
	if c.head.State == declared.Complete {
		return "stale"
	}
	return string(c.head.State)
}

// clusterStates are state's values.
var clusterStates = []string{"not-read", "saved", "absent", "gone", "syncing", "incomplete", "stale", "complete"}

// detail is /readyz's line for the list ("" when known and complete or
// absent).
func (c *clusterKeep) detail(now time.Time) string {
	s, why := c.input(now)
	if s == gc.InputKnown {
		return ""
	}
	return fmt.Sprintf("%s (%d images kept)", why, len(c.refs))
}

// ClusterSetting is the cluster keep list as a policy setting (plan,
// /status): how many images it keeps, and from what.
func (k *fleetKeep) ClusterSetting(now time.Time) Setting {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.cl
	src := "gcagent-cluster's key " + c.key() + ": " + c.state(now)
	if c.head != nil {
		src += fmt.Sprintf(" (written by %s, %d workloads)", c.head.By, c.head.Workloads)
	}
	if _, why := c.input(now); why != "" {
		src += "; " + why
	}
	return Setting{Name: "cluster-keep", Value: fmt.Sprintf("%d images", len(c.refs)), Source: src}
}
