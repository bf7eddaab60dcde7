// Package logs removes the kubelet's dead log symlinks (LogDir,
// /var/log/containers) and orphaned pod log directories (PodLogDir,
// /var/log/pods), reacting to fsnotify events, projection changes and
// grace deadlines instead of polling.
//
// PlanLogs is the pure planner; the Cleaner scans, plans and applies, each
// removal a delete transaction (package deletion) whose commit is its
// log.removed event. Every delete is relative to an open directory
// (unlinkat with fstatat and statx under AT_SYMLINK_NOFOLLOW, openat with
// O_NOFOLLOW|O_DIRECTORY when descending): no symlink is ever followed for
// a delete, no mount point is crossed, and nothing outside the two
// configured directories is touched. What it removes depends on what shows
// that the pod log dir is the kubelet's and the watched containerd's
// (Evidence): dangling links and orphaned pod dirs as the kubelet removes
// them where it does, none of them where nothing does.
package logs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// deleteLog begins delete transactions; a *deletion.Manager is one.
type deleteLog interface {
	// Begin records the intent (a log's path is its identity: none other).
	Begin(ctx context.Context, ns string, a schema.Action, id *deletion.Identity) (*deletion.Tx, error)
}

// Publisher hands to the fleet bus what is not a removal: a dry run's
// log.skipped. Publish must not block on the network (natsbus puts the
// event in its durable outbox); an error is logged and counted, never
// retried here.
type Publisher interface {
	Publish(a schema.Action) error
}

// Removal is schema.LogRemoval: the data of log.removed.
type Removal = schema.LogRemoval

// skip is schema.LogSkip: the data of log.skipped.
type skip = schema.LogSkip

// Deps are what a Cleaner works through: State is required.
type Deps struct {
	// State answers from the projection (LiveState, StaticState).
	State State
	// Changes, when set, signals projection changes (a container exited
	// or went, a pod went): each asks Run for a pass, at most one per
	// Options.MinGap.
	Changes <-chan struct{}
	// Deletes begins each removal's delete transaction (a
	// *deletion.Manager): its intent is recorded before the removal, and
	// the removal's log.removed event is its commit. nil: nothing is
	// removed, as in a dry run (for plans).
	Deletes deleteLog
	// Publisher receives what is not a removal (a dry run's skips); nil:
	// nothing published.
	Publisher Publisher
	// PodDirs records the pod dirs each full read of PodLogDir sees (the
	// deleted-pod sign: a dir seen, then gone), and saves them after each
	// pass. nil: a new one, kept nowhere. A Cleaner that only plans
	// (Plan) reads into a copy and changes nothing.
	PodDirs *PodDirs
}

// Options configure a Cleaner.
type Options struct {
	// Config is the directories and the grace; it must pass Validate.
	Config  Config
	Metrics *Metrics       // nil: nothing recorded
	Log     zerolog.Logger // the zero Logger logs nothing
	// Clock gives the time and arms Run's timers (the grace deadlines, the
	// floor sweep, the retry of a lost watch, the gap between passes asked
	// by Changes); nil: Go's.
	Clock clock.Timers
	// MinGap spaces the passes Changes asks for: a burst of changes costs
	// one pass (two directory scans) per gap, not one per change.
	MinGap time.Duration
	// Wall reads the wall clock the filesystem stamps files with: how long
	// a link or a pod dir has been quiet is measured on it, never on
	// Clock. nil: Go's time.Now.
	Wall func() time.Time
}

// Cleaner applies PlanLogs to the configured directories. Its methods are
// safe for concurrent use; passes are serialized.
type Cleaner struct {
	cfg     Config
	state   State
	changes <-chan struct{}
	minGap  time.Duration
	deletes deleteLog
	pub     Publisher
	metrics *Metrics
	log     zerolog.Logger
	now     func() time.Time
	wall    func() time.Time
	clock   clock.Timers
	kick    chan struct{}

	last atomic.Pointer[Plan] // of the last Clean, for Status

	deepFull bool // the deep watch limit was reached (logged once); Run's goroutine only

	unverifiableSaid bool     // links kept as unverifiable were logged; guarded by mu
	evidenceSaid     Verified // what was last said of the pod log dir (sayEvidence); guarded by mu
	otherSaid        Evidence // the last verdict for another containerd logged; guarded by mu

	mu   sync.Mutex // serializes passes; guards seen
	seen map[key]*tracked

	dirs     *PodDirs
	dirsSaid string // the last pod dir read problem logged; guarded by mu
	saveSaid bool   // a failed save of dirs was logged; guarded by mu
}

type key struct {
	kind Kind
	name string
}

// tracked is what the Cleaner remembers of an entry while it exists.
type tracked struct {
	firstSeen time.Time
	noted     Reason // last reason logged for a kept entry
	dryRun    bool   // dry-run removal already reported
}

// notable are the keep reasons an operator should hear about, once.
var notable = map[Reason]bool{
	ReasonBadName: true, ReasonTargetError: true, ReasonTruncatedName: true, ReasonMountPoint: true, ReasonChangeUnknown: true,
}

// New returns a Cleaner; it fails if the config is invalid or there is no
// State.
func New(d Deps, o Options) (*Cleaner, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if d.State == nil {
		return nil, errors.New("logs: nil State")
	}
	if o.Clock == nil {
		o.Clock = clock.System(nil)
	}
	if d.PodDirs == nil {
		d.PodDirs = NewPodDirs("")
	}
	if o.Wall == nil {
		o.Wall = time.Now
	}
	return &Cleaner{dirs: d.PodDirs,
		cfg: o.Config, state: d.State, changes: d.Changes, minGap: o.MinGap, deletes: d.Deletes, pub: d.Publisher, metrics: o.Metrics, now: o.Clock.Now, wall: o.Wall, clock: o.Clock,
		log:  o.Log.With().Str("component", "logs").Logger(),
		kick: make(chan struct{}, 1),
		seen: map[key]*tracked{},
	}, nil
}

// Notify asks Run for a new pass, e.g. because the projection changed. It
// never blocks; calls before the pass starts coalesce into one.
func (c *Cleaner) Notify() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Status returns the plan of the last pass of Clean (zero before the
// first). It does not wait for a running pass.
func (c *Cleaner) Status() Plan {
	p := c.last.Load()
	if p == nil {
		return Plan{}
	}
	cp := *p
	cp.Decisions, cp.Problems = slices.Clone(p.Decisions), slices.Clone(p.Problems)
	return cp
}

// Plan scans both directories and plans, deleting nothing and changing no
// state (for `gcagent plan`). Entries the Cleaner has not seen before count
// as first seen now.
func (c *Cleaner) Plan() (Plan, error) {
	return c.pass(context.Background(), false)
}

// Clean runs one full pass: scan both directories, plan, and remove what
// the plan says, re-checking each entry right before removing it. It
// returns the plan and the per-item errors joined; an error on one item
// does not stop the others. Run calls it; tests call it after moving their
// clock.
func (c *Cleaner) Clean(ctx context.Context) (Plan, error) {
	return c.pass(ctx, true)
}

func (c *Cleaner) pass(ctx context.Context, apply bool) (Plan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	dirs := c.dirs
	if !apply {
		dirs = dirs.Clone() // a plan changes nothing
	}
	roots, entries, read, scanErr := c.scan(dirs, now, apply)
	defer func() {
		for _, fd := range roots {
			unix.Close(fd)
		}
	}()
	c.track(entries, now, apply)
	ev := c.evidence(dirs, entries, read, now, apply)
	if apply {
		c.saveDirs(dirs) // what the pass read and showed
	}
	c.age(roots[KindPodDir], entries, ev)
	quiet(entries, c.wall())

	plan := PlanLogs(entries, ev, c.state, c.cfg.PodLogGrace, now)
	plan.DryRun = c.cfg.DryRun
	plan.Problems = c.problems(plan)
	if !apply {
		return plan, scanErr
	}
	c.sayUnverifiable(plan)
	c.sayEvidence(plan)
	errs := []error{scanErr}
	if scanErr != nil {
		c.metrics.error("scan")
	}
	last := plan
	last.Decisions, last.Problems = slices.Clone(plan.Decisions), slices.Clone(plan.Problems)
	c.last.Store(&last)
	c.metrics.pass(plan)

	byKey := make(map[key]Entry, len(entries))
	for _, e := range entries {
		byKey[key{e.Kind, e.Name}] = e
	}
	for _, d := range plan.Decisions {
		if d.Action != ActionRemove {
			c.note(d)
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		dir := c.cfg.LogDir
		if d.Kind == KindPodDir {
			dir = c.cfg.PodLogDir
		}
		if err := c.remove(ctx, roots[d.Kind], dir, byKey[key{d.Kind, d.Name}], d, ev); err != nil {
			c.metrics.error("remove")
			errs = append(errs, err)
			if errors.Is(err, deletion.ErrUnsettled) {
				// No removal may begin until an earlier delete's outcome
				// is known; each try would wait on the node again.
				break
			}
		}
	}
	return plan, errors.Join(errs...)
}

// scan opens both configured directories (the caller closes the fds in
// roots; a missing directory has none) and scans them: the pod log dir
// first, whose full read goes to dirs (read says whether it succeeded),
// then the links, judged by it. Errors are joined; what could be scanned
// is returned.
func (c *Cleaner) scan(dirs *PodDirs, now time.Time, save bool) (roots map[Kind]int, entries []Entry, read bool, err error) {
	roots = map[Kind]int{}
	var errs []error
	podDirsRead := false
	for _, kind := range []Kind{KindPodDir, KindSymlink} {
		dir := c.cfg.LogDir
		if kind == KindPodDir {
			dir = c.cfg.PodLogDir
		}
		fd, err := openRoot(dir)
		errs = append(errs, err)
		if fd < 0 {
			if kind == KindPodDir {
				cause := "missing"
				if err != nil {
					cause = err.Error()
				}
				c.dirsFailed(dirs, cause, now, save)
			}
			continue
		}
		roots[kind] = fd
		es, unsure, read, serr := scanDir(c.cfg, fd, dir, kind)
		errs = append(errs, serr)
		if kind == KindPodDir {
			mounted, err := mountedNames(fd)
			errs = append(errs, err)
			for i := range es {
				es[i].Mounted = mounted[es[i].Name]
			}
			id, ierr := dirID(fd)
			switch {
			case !read:
				c.dirsFailed(dirs, serr.Error(), now, save)
			case ierr != nil:
				errs = append(errs, ierr)
				c.dirsFailed(dirs, ierr.Error(), now, save)
			default:
				c.dirsRead(dirs, id, es, unsure, now, save)
				podDirsRead = true
			}
		} else {
			for i := range es {
				if es[i].TargetPodDir != "" && errors.Is(es[i].TargetErr, fs.ErrNotExist) {
					_, es[i].TargetPodDirGone = dirs.dirGone(es[i].TargetPodDir)
				}
			}
		}
		entries = append(entries, es...)
	}
	return roots, entries, podDirsRead, errors.Join(errs...)
}

// track fills in FirstSeen and, when apply, remembers new entries and
// forgets vanished ones.
func (c *Cleaner) track(entries []Entry, now time.Time, apply bool) {
	present := make(map[key]bool, len(entries))
	for i := range entries {
		k := key{entries[i].Kind, entries[i].Name}
		present[k] = true
		t := c.seen[k]
		if t == nil {
			t = &tracked{firstSeen: now}
			if apply {
				c.seen[k] = t
			}
		}
		entries[i].FirstSeen = t.firstSeen
	}
	if apply {
		for k := range c.seen {
			if !present[k] {
				delete(c.seen, k)
			}
		}
	}
}

// note logs a kept entry once per notable reason it is kept for.
func (c *Cleaner) note(d Decision) {
	t := c.seen[key{d.Kind, d.Name}]
	if t == nil || t.noted == d.Reason || !notable[d.Reason] {
		return
	}
	t.noted = d.Reason
	ev := c.log.Warn().Str("path", c.path(d)).Str("kind", string(d.Kind)).Str("reason", string(d.Reason))
	if d.Detail != "" {
		ev = ev.Str("detail", d.Detail)
	}
	ev.Msg("kept")
}

func (c *Cleaner) path(d Decision) string {
	if d.Kind == KindPodDir {
		return display(c.cfg.PodLogDir, d.Name)
	}
	return display(c.cfg.LogDir, d.Name)
}

// remove re-checks one entry the plan said to remove and removes it in a
// delete transaction (or, in a dry run, reports it once), logs, publishes
// and records it.
func (c *Cleaner) remove(ctx context.Context, root int, dir string, e Entry, planned Decision, ev Evidence) error {
	path := c.path(planned)
	fresh, gone, err := scanEntry(c.cfg, root, e.Kind, e.Name)
	if err != nil {
		return fmt.Errorf("re-check %s: %w", path, err)
	}
	if gone {
		return nil
	}
	fresh.Mounted, fresh.FirstSeen = e.Mounted, e.FirstSeen
	if fresh.TargetPodDir != "" && errors.Is(fresh.TargetErr, fs.ErrNotExist) {
		_, fresh.TargetPodDirGone = c.dirs.dirGone(fresh.TargetPodDir)
	}
	// A pod dir's change time is read again by the removal's own walk
	// (quietSince), right before it unlinks anything.
	if e.Kind == KindPodDir {
		fresh.Changed, fresh.ChangedErr = e.Changed, e.ChangedErr
	}
	wall := c.wall()
	if !fresh.Changed.IsZero() {
		fresh.Quiet = wall.Sub(fresh.Changed)
	}
	d := decide(fresh, ev, c.state, c.cfg.PodLogGrace, c.now())
	if d.Action != ActionRemove {
		c.log.Info().Str("path", path).Str("reason", string(d.Reason)).Msg("kept on re-check")
		return nil
	}
	t := c.seen[key{e.Kind, e.Name}]
	r := Removal{Kind: d.Kind, Dir: dir, Name: d.Name, Reason: d.Reason, Container: d.Container, UID: d.UID,
		Namespace: events.CRINamespace, At: c.now()}
	if c.cfg.DryRun || c.deletes == nil {
		if t.dryRun {
			return nil
		}
		return c.dryRun(root, e, planned, r, t, wall.Add(-c.cfg.PodLogGrace))
	}

	// The delete transaction: the intent is durable before the removal,
	// so a crash or an unknown outcome after it still gets exactly its
	// event. The outbox makes the key unique to this removal.
	subject := filepath.Join(dir, e.Name)
	tx, err := c.deletes.Begin(ctx, "", schema.Action{Kind: schema.KindLog, Action: schema.ActionRemoved,
		Subject: subject, Key: string(d.Kind) + ":" + subject, Data: r}, nil)
	if err != nil {
		c.metrics.error("intent")
		return fmt.Errorf("remove %s: %w", path, err)
	}
	var removed tally
	if err := context.Cause(tx.Call(ctx)); err != nil { // the agent lock, right before the removal
		_ = tx.Abort()
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if e.Kind == KindPodDir {
		removed, err = removePodDir(root, dir, e.Name, false, wall.Add(-c.cfg.PodLogGrace))
	} else {
		var ok bool
		if ok, err = removeLink(root, dir, e.Name, false); ok {
			removed.entries = 1
		}
	}
	switch {
	case err == nil && removed.entries == 0:
		// Gone since the re-check, by another hand (the removal of its
		// container takes its link): not our removal.
		_ = tx.Abort()
		c.log.Debug().Str("path", path).Msg("gone before the removal")
		return nil
	case err == nil:
	case removed.entries > 0:
		// Part of the pod dir went: that is a removal, reported with what
		// went and why the rest stayed; the next pass tries the rest.
		r.Partial, r.Error = true, err.Error()
	default:
		// Nothing went by our hand: the path says whether it is gone.
		switch out, serr := tx.Settle(ctx); out {
		case deletion.Happened:
			c.log.Warn().Str("path", path).Err(err).Msg("the removal reported an error but the path is gone")
		case deletion.NotHappened:
			if errors.Is(err, errMount) {
				c.keptMounted(t, path, d.Kind, err)
				return nil
			}
			if errors.Is(err, errRecent) {
				c.log.Info().Str("path", path).Str("reason", string(ReasonGrace)).Err(err).Msg("kept on re-check")
				return nil
			}
			return fmt.Errorf("remove %s: %w", path, err)
		default:
			return fmt.Errorf("remove %s: outcome unknown (%w): %w", path, serr, err)
		}
	}

	at := c.now()
	if e.Kind == KindPodDir && !r.Partial {
		c.dirs.went(e.Name, at)
	}
	r.Bytes, r.Entries, r.At = removed.bytes, removed.entries, at
	latency := at.Sub(planned.EligibleAt)
	c.metrics.removal(d, latency.Seconds())
	line, msg := c.log.Info(), "removed"
	if r.Partial {
		line, msg = c.log.Warn().Err(err), "removed in part"
		err = fmt.Errorf("remove %s: removed in part: %w", path, err)
	}
	c.event(line, path, d).Int64("size_bytes", r.Bytes).Int("entries", r.Entries).Float64("latency_s", latency.Seconds()).Msg(msg)
	if cerr := tx.Commit(r); cerr != nil {
		c.metrics.error("publish")
		c.log.Warn().Str("path", path).Err(cerr).Msg("store the removal's event")
	}
	return err
}

// dryRun reports, once per entry, that a dry run would remove it: logged,
// and published as log.skipped with reason dry-run, never on the removal
// subject.
func (c *Cleaner) dryRun(root int, e Entry, planned Decision, r Removal, t *tracked, quiet time.Time) error {
	path := c.path(planned)
	if e.Kind == KindPodDir {
		found, err := removePodDir(root, r.Dir, e.Name, true, quiet)
		if errors.Is(err, errMount) {
			c.keptMounted(t, path, r.Kind, err)
			return nil
		}
		if errors.Is(err, errRecent) {
			return nil // the next pass plans it again
		}
		if err != nil {
			return fmt.Errorf("check %s: %w", path, err)
		}
		r.Bytes, r.Entries = found.bytes, found.entries
	} else {
		r.Entries = 1
	}
	t.dryRun = true
	r.At, r.DryRun = c.now(), true
	latency := r.At.Sub(planned.EligibleAt)
	c.event(c.log.Info(), path, planned).Int64("size_bytes", r.Bytes).Float64("latency_s", latency.Seconds()).Bool("dry_run", true).Msg("would remove")
	if c.pub == nil {
		return nil
	}
	subject := filepath.Join(r.Dir, e.Name)
	if err := c.pub.Publish(schema.Action{Kind: schema.KindLog, Action: schema.ActionSkipped, Subject: subject,
		Key:  string(r.Kind) + ":" + subject + "@" + strconv.FormatInt(r.At.UnixNano(), 10) + "#dry-run",
		Data: skip{LogRemoval: r, SkipReason: schema.ReasonDryRun}}); err != nil {
		c.metrics.error("publish")
		c.log.Warn().Str("path", path).Err(err).Msg("publish dry run")
	}
	return nil
}

// keptMounted logs, once per entry, that a pod dir is kept because the
// walk met a mount point in it.
func (c *Cleaner) keptMounted(t *tracked, path string, kind Kind, err error) {
	if t.noted == ReasonMountPoint {
		return
	}
	t.noted = ReasonMountPoint
	c.log.Warn().Str("path", path).Str("kind", string(kind)).Str("reason", string(ReasonMountPoint)).Err(err).Msg("kept")
}

// event adds an entry's fields to a log line.
func (c *Cleaner) event(ev *zerolog.Event, path string, d Decision) *zerolog.Event {
	ev = ev.Str("path", path).Str("kind", string(d.Kind)).Str("reason", string(d.Reason))
	if d.Container != "" {
		ev = ev.Str("container", d.Container)
	}
	if d.UID != "" {
		ev = ev.Str("uid", d.UID)
	}
	return ev
}
