package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/natsbus"
)

// minKeepBucketBytes is the size the component needs of the keep list's
// bucket: a list of 20,000 images is about 4 MiB, kept with its history.
const minKeepBucketBytes = 64 << 20

// publisher writes keep-sync's list as the cluster key of the fleet keep
// list, while this replica leads: shards first, then the head that names
// their layout; a shard only when it changed; the head at every change and
// every heartbeat, by compare-and-set, so that a second writer (a leader
// that has not noticed it lost) is found out and stops. Shards are written
// only while the head is still the one this replica wrote (fence), and at
// every heartbeat and after a failed write the store is compared with what
// was written (verify): what is not as written is written again.
type publisher struct {
	cfg   Config
	kv    jetstream.KeyValue
	ks    *keepSync
	clock clock.Timers
	log   zerolog.Logger
	m     *metrics

	written      map[string][]byte // key → the value last written or read
	rev          map[string]uint64 // key → the revision of that value
	headRev      uint64
	head         declared.Head // the head last written (Heartbeat aside)
	layout       int
	lastComplete []declared.Entry
	// suspect says a write failed: the store may not hold what was
	// written (verify before the next publish).
	suspect bool
	// ensure makes the bucket again when it is gone (nil: it is not).
	ensure func(context.Context) (jetstream.KeyValue, error)
}

func newPublisher(cfg Config, kv jetstream.KeyValue, ks *keepSync, c clock.Timers, m *metrics, log zerolog.Logger) *publisher {
	return &publisher{cfg: cfg, kv: kv, ks: ks, clock: c, m: m, log: log.With().Str("component", "keep-sync").Logger(),
		written: map[string][]byte{}, rev: map[string]uint64{}}
}

// ensureKeepBucket returns the keep list's bucket, made or grown to hold
// the cluster list.
func ensureKeepBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := natsbus.EnsureKeepBucket(ctx, js, replicas, minKeepBucketBytes)
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("keep list bucket: %w", err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if info.Config.MaxBytes >= 0 && info.Config.MaxBytes < minKeepBucketBytes {
		cfg := natsbus.KeepBucketConfig(info.Config.Replicas, minKeepBucketBytes)
		if _, err := js.UpdateKeyValue(ctx, cfg); err != nil {
			return nil, fmt.Errorf("keep list bucket holds %d bytes, the cluster list needs %d: %w", info.Config.MaxBytes, minKeepBucketBytes, err)
		}
	}
	return kv, nil
}

// seed reads what the cluster key holds (a previous leader's list): its
// layout and values, and every image it lists that no workload names now
// waits out the grace from the time recorded (or from now).
func (p *publisher) seed(ctx context.Context) error {
	now := p.clock.Now()
	e, err := p.kv.Get(ctx, declared.HeadKey(p.cfg.Cluster))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil
	case err != nil:
		return fmt.Errorf("read the cluster keep list's head: %w", err)
	}
	p.headRev = e.Revision()
	h, err := declared.DecodeHead(e.Value())
	if err != nil {
		p.log.Warn().Err(err).Msg("the cluster keep list's head does not decode: writing a new one")
		return nil
	}
	p.layout = h.Shards
	shards := map[string]declared.Shard{}
	for i := range h.Shards {
		key := declared.ShardKey(p.cfg.Cluster, h.Shards, i)
		se, err := p.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read the cluster keep list: %w", err)
		}
		s, err := declared.DecodeShard(se.Value())
		if err != nil {
			continue
		}
		p.written[key], p.rev[key] = se.Value(), se.Revision()
		shards[key] = s
	}
	l := declared.Assemble(p.cfg.Cluster, &h, shards)
	for _, im := range l.Images {
		var t time.Time
		if im.Undeclared != nil {
			t = *im.Undeclared
		}
		p.ks.seed(im.Ref, t, now)
		p.lastComplete = append(p.lastComplete, declared.Entry{Image: im.Ref})
	}
	p.log.Info().Str("by", h.By).Str("state", string(h.State)).Int("images", len(l.Images)).Int("shards", h.Shards).
		Msg("read the cluster keep list the last leader wrote: its images wait out their grace before they go")
	return nil
}

// publish writes the list as it is now; heartbeat rewrites the head even
// when nothing changed. It returns when the next image is due for release
// (zero: none).
func (p *publisher) publish(ctx context.Context, heartbeat bool) (next time.Time, err error) {
	defer func() {
		if err != nil {
			p.suspect = true
		}
	}()
	if heartbeat || p.suspect {
		if err := p.verify(ctx); err != nil {
			return time.Time{}, err
		}
		p.suspect = false
	}
	now := p.clock.Now()
	state, reason := p.ks.state()
	h := declared.Head{State: state, Reason: reason, Shards: p.layout, Kinds: p.cfg.Kinds, Namespaces: p.cfg.Namespaces,
		ExcludeNamespaces: p.cfg.ExcludeNamespaces, ReleaseAfterS: p.cfg.ReleaseAfter.Seconds(), HeartbeatEveryS: p.cfg.Heartbeat.Seconds(),
		By: p.cfg.Identity, Since: p.head.Since}
	if state != declared.Syncing {
		entries, released, due, workloads := p.ks.entries(now, state == declared.Complete)
		next = due
		if state == declared.Incomplete {
			entries = union(entries, p.lastComplete)
		}
		shards := declared.Layout(entries, 0)
		if err := p.putShards(ctx, shards); err != nil {
			return next, err
		}
		h.Shards, h.Images, h.Workloads = len(shards), len(entries), workloads
		if len(released) > 0 {
			p.m.released.Add(float64(len(released)))
			p.log.Info().Strs("images", released).Float64("grace_s", p.cfg.ReleaseAfter.Seconds()).
				Msg("released from the cluster keep list: no workload has named them for the grace")
		}
		if state == declared.Complete {
			p.lastComplete = entries
		}
		p.m.images.Set(float64(len(entries)))
		p.m.workloads.Set(float64(workloads))
		releasing := 0
		for _, e := range entries {
			if !e.Undeclared.IsZero() {
				releasing++
			}
		}
		p.m.releasing.Set(float64(releasing))
	}
	if h.State != p.head.State || h.Since.IsZero() {
		h.Since = now
	}
	changed := !sameHead(h, p.head)
	if changed || heartbeat {
		h.Heartbeat = now
		if err := p.putHead(ctx, h); err != nil {
			return next, err
		}
		if changed && h.State != p.head.State {
			ev := p.log.Info()
			if h.State == declared.Incomplete {
				ev = p.log.Warn()
			}
			ev.Str("state", string(h.State)).Str("reason", h.Reason).Int("images", h.Images).Int("shards", h.Shards).Msg("cluster keep list published")
		}
		p.head = h
	}
	if old := p.layout; old != h.Shards && old > 0 && h.State != declared.Syncing {
		p.dropLayout(ctx, old)
	}
	p.layout = h.Shards
	for _, s := range []declared.State{declared.Syncing, declared.Complete, declared.Incomplete} {
		p.m.state.WithLabelValues(string(s)).Set(b2f(s == h.State))
	}
	p.m.lastPublish.Set(float64(now.UnixNano()) / 1e9)
	return next, nil
}

// putShards writes the shards of a layout whose values changed, once the
// fence holds.
func (p *publisher) putShards(ctx context.Context, shards []declared.Shard) error {
	keys, vals := make([]string, len(shards)), make([][]byte, len(shards))
	changed := false
	for i, s := range shards {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		keys[i], vals[i] = declared.ShardKey(p.cfg.Cluster, len(shards), i), b
		changed = changed || !bytes.Equal(p.written[keys[i]], b)
	}
	if !changed {
		return nil
	}
	if err := p.fence(ctx); err != nil {
		return err
	}
	for i, key := range keys {
		if bytes.Equal(p.written[key], vals[i]) {
			continue
		}
		rev, err := p.kv.Put(ctx, key, vals[i])
		if err != nil {
			p.m.writeFailures.Inc()
			return fmt.Errorf("write %s: %w", key, err)
		}
		p.m.writes.WithLabelValues("shard").Inc()
		p.written[key], p.rev[key] = vals[i], rev
	}
	return nil
}

// fence checks, before shards are written, that the head is still the one
// this replica wrote or read last: a leader that has not noticed it lost
// (frozen past its Lease, cut off from the API server) finds out before it
// overwrites the shards of the new one, which, holding them as written,
// would not write them again. A head gone (the store lost it) makes every
// key be written again.
func (p *publisher) fence(ctx context.Context) error {
	e, err := p.kv.Get(ctx, declared.HeadKey(p.cfg.Cluster))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		if p.headRev != 0 {
			p.forget("the head is gone")
		}
		return nil
	case err != nil:
		return fmt.Errorf("read %s: %w", declared.HeadKey(p.cfg.Cluster), err)
	case e.Revision() == p.headRev:
		return nil
	}
	if other, derr := declared.DecodeHead(e.Value()); derr == nil && other.By != p.cfg.Identity {
		return fmt.Errorf("%w (%s)", errOtherWriter, other.By)
	}
	p.headRev = e.Revision() // our own write whose answer was lost
	return nil
}

// verify compares the store with what this replica wrote: a key whose
// revision is not the one it wrote or read (another writer, a delete by
// hand, writes a NATS server lost, the bucket deleted and made again) is
// forgotten, so that publish writes it again; a head gone is created
// again. A bucket gone is made again.
func (p *publisher) verify(ctx context.Context) error {
	revs, err := p.revisions(ctx)
	if err != nil && p.ensure != nil {
		kv, eerr := p.ensure(ctx)
		if eerr != nil {
			return fmt.Errorf("read the cluster keep list's revisions: %w", errors.Join(err, eerr))
		}
		p.kv = kv
		revs, err = p.revisions(ctx)
	}
	if err != nil {
		return fmt.Errorf("read the cluster keep list's revisions: %w", err)
	}
	var lost []string
	for key, rev := range p.rev {
		if revs[key] != rev {
			lost = append(lost, key)
			delete(p.written, key)
			delete(p.rev, key)
		}
	}
	if _, ok := revs[declared.HeadKey(p.cfg.Cluster)]; !ok && p.headRev != 0 {
		p.forget("the head is gone")
		return nil
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		p.log.Warn().Strs("keys", lost).Msg("the cluster keep list in NATS is not as this replica wrote it: writing those keys again")
	}
	return nil
}

// forget drops what this replica holds as written, head included: every
// key is written again, the head created.
func (p *publisher) forget(why string) {
	p.log.Warn().Str("reason", why).Int("shards", p.layout).Msg("the cluster keep list in NATS is not as this replica wrote it: writing it all again")
	clear(p.written)
	clear(p.rev)
	p.headRev, p.head = 0, declared.Head{Since: p.head.Since}
}

// revisions lists the revision of every key of the cluster's list (its
// headers only, as ListKeys does).
func (p *publisher) revisions(ctx context.Context) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := p.kv.Watch(ctx, declared.WatchKeys(p.cfg.Cluster), jetstream.MetaOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	revs := map[string]uint64{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("the watch of its keys ended")
			}
			if e == nil {
				return revs, nil
			}
			revs[e.Key()] = e.Revision()
		}
	}
}

// errOtherWriter says the head was written by someone else since this
// replica last wrote it: another leader. This one stops writing.
var errOtherWriter = errors.New("the cluster keep list's head was written by another instance")

// putHead writes the head by compare-and-set on the revision last seen.
func (p *publisher) putHead(ctx context.Context, h declared.Head) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	key := declared.HeadKey(p.cfg.Cluster)
	var rev uint64
	if p.headRev == 0 {
		rev, err = p.kv.Create(ctx, key, b)
	} else {
		rev, err = p.kv.Update(ctx, key, b, p.headRev)
	}
	if err != nil {
		p.m.writeFailures.Inc()
		if errors.Is(err, jetstream.ErrKeyExists) {
			if e, gerr := p.kv.Get(ctx, key); gerr == nil {
				if other, derr := declared.DecodeHead(e.Value()); derr == nil && other.By != p.cfg.Identity {
					return fmt.Errorf("%w (%s)", errOtherWriter, other.By)
				}
				p.headRev = e.Revision() // our own write whose answer was lost
				return p.putHead(ctx, h)
			}
		}
		return fmt.Errorf("write %s: %w", key, err)
	}
	p.m.writes.WithLabelValues("head").Inc()
	p.headRev = rev
	return nil
}

// dropLayout deletes the shards of a layout no head names any more.
func (p *publisher) dropLayout(ctx context.Context, n int) {
	for i := range n {
		key := declared.ShardKey(p.cfg.Cluster, n, i)
		if err := p.kv.Purge(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			p.log.Debug().Err(err).Str("key", key).Msg("cannot purge a shard of an old layout")
		}
		delete(p.written, key)
		delete(p.rev, key)
	}
}

// sameHead compares heads but for their heartbeat.
func sameHead(a, b declared.Head) bool {
	a.Heartbeat, b.Heartbeat = time.Time{}, time.Time{}
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// union returns es with the images of last that es lacks, as kept from
// the last complete list.
func union(es, last []declared.Entry) []declared.Entry {
	have := make(map[string]bool, len(es))
	for _, e := range es {
		have[e.Image] = true
	}
	out := es
	for _, e := range last {
		if !have[e.Image] {
			out = append(out, declared.Entry{Image: e.Image, By: []declared.Workload{{Kind: "LastCompleteList", Name: "kept while the list is incomplete"}}})
		}
	}
	return out
}

// run publishes until ctx ends: at every change (gathered for 100 ms),
// every heartbeat, and when an image's grace ends; a failed publish is
// tried again a second later, a heartbeat included. With leader election,
// a leader that has not published for three heartbeats (the agents call
// the list stale) returns an error: it gives the lead up, so that a
// replica that can write takes over.
func (p *publisher) run(ctx context.Context) error {
	if err := p.seed(ctx); err != nil {
		return err
	}
	hb := p.clock.NewTimer(0)
	defer hb.Stop()
	release := p.clock.NewTimer(time.Hour)
	defer release.Stop()
	debounce := p.clock.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	pending := false
	heartbeat := false // due until a publish writes it
	lastOK := p.clock.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.ks.changed:
			if !pending {
				pending = true
				debounce.Reset(100 * time.Millisecond)
			}
			continue
		case <-debounce.C():
			pending = false
		case <-hb.C():
			heartbeat = true
			hb.Reset(p.cfg.Heartbeat)
		case <-release.C():
		}
		at := p.clock.Now() // a heartbeat written says this time
		next, err := p.publish(ctx, heartbeat)
		if errors.Is(err, errOtherWriter) {
			return err
		}
		if failing := p.clock.Now().Sub(lastOK); err != nil && p.cfg.LeaderElection && failing >= 3*p.cfg.Heartbeat {
			return fmt.Errorf("cannot publish the cluster keep list for %s, the agents call it stale: %w", failing.Round(time.Second), err)
		}
		if err != nil {
			p.log.Warn().Err(err).Msg("cannot publish the cluster keep list; trying again")
			debounce.Reset(time.Second)
			pending = true
			continue
		}
		heartbeat, lastOK = false, at
		d := time.Hour
		if !next.IsZero() {
			d = max(next.Sub(p.clock.Now()), 10*time.Millisecond)
		}
		release.Reset(d)
	}
}
