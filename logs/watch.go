package logs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Run watches both directories and runs a pass at start, on every change in
// them, on watcher errors and overflows (the pass is always a full rescan),
// on Notify, and when the earliest grace deadline expires. A directory that
// is missing or whose watch is lost (deleted, moved, unmounted) is watched
// again as soon as it is back, retrying with backoff meanwhile. Run returns
// nil when ctx is done, and an error only if the watcher cannot work.
func (c *Cleaner) Run(ctx context.Context) error {
	if c.changes != nil {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go c.follow(ctx)
	}
	w, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		return fmt.Errorf("logs: new watcher: %w", err)
	}
	defer w.Close()

	armed := map[string]bool{}
	var retry time.Duration
	timer := c.clock.NewTimer(0) // first pass now
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("logs: watcher closed")
			}
			c.log.Debug().Str("event", ev.String()).Msg("fsnotify")
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("logs: watcher closed")
			}
			c.watchError(err)
		case <-c.kick:
		case <-timer.C():
		}
		c.drain(w)

		// Watch first, then scan: nothing changed between is missed.
		missing := c.arm(w, armed)
		plan, err := c.Clean(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.log.Error().Err(err).Msg("pass")
		}
		// Pod dirs and their container dirs appear with the pods: watching
		// them after the pass covers what appeared meanwhile, because their
		// creation woke the next pass.
		c.armDeep(w, plan)

		// A full sweep at least every FloorSweep, whatever the watches
		// missed, so no link outlives the kubelet's 1-minute sweep.
		wait := FloorSweep
		if !plan.Next.IsZero() {
			wait = min(max(plan.Next.Sub(c.now()), 0), wait)
		}
		if missing {
			retry = min(max(2*retry, time.Second), time.Minute)
			wait = min(wait, retry)
		} else {
			retry = 0
		}
		timer.Reset(wait)
	}
}

// FloorSweep is the longest time between two full passes.
const FloorSweep = time.Minute

// maxDeepWatches bounds the watches on pod and container log dirs (inotify
// watches are a per-user kernel resource); past it, the floor sweep covers
// the rest.
const maxDeepWatches = 8192

// armDeep watches each pod dir of the plan and its container dirs (where
// the kubelet's links point), so a log file removed deep inside a pod dir
// wakes a pass at once. Only real directories are watched (never through a
// symlink); watches of removed dirs go away with them.
func (c *Cleaner) armDeep(w *fsnotify.Watcher, plan Plan) {
	watched := map[string]bool{}
	for _, p := range w.WatchList() {
		watched[p] = true
	}
	n := len(watched)
	for _, d := range plan.Decisions {
		if d.Kind != KindPodDir || d.Reason == ReasonNotDirectory || d.Reason == ReasonBadName {
			continue
		}
		dir := filepath.Join(c.cfg.PodLogDir, d.Name)
		paths := []string{dir}
		if subs, err := os.ReadDir(dir); err == nil {
			for _, sub := range subs {
				if sub.IsDir() { // from the directory entry: a symlink is not
					paths = append(paths, filepath.Join(dir, sub.Name()))
				}
			}
		}
		for _, p := range paths {
			if watched[p] {
				continue
			}
			if n >= maxDeepWatches {
				if !c.deepFull {
					c.deepFull = true
					c.log.Warn().Int("watches", n).Msg("deep watch limit reached; the floor sweep covers the rest")
				}
				return
			}
			if err := w.Add(p); err == nil {
				watched[p] = true
				n++
				c.log.Debug().Str("path", p).Msg("watching")
			}
		}
	}
	c.deepFull = false
}

// drain swallows what is already queued: the coming pass covers it.
func (c *Cleaner) drain(w *fsnotify.Watcher) {
	for {
		select {
		case _, ok := <-w.Events:
			if !ok {
				return
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			c.watchError(err)
		case <-c.kick:
		default:
			return
		}
	}
}

func (c *Cleaner) watchError(err error) {
	c.metrics.error("watch")
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		c.log.Warn().Err(err).Msg("watcher overflow, full rescan")
		return
	}
	c.log.Error().Err(err).Msg("watcher error, full rescan")
}

// arm watches each configured directory not watched yet and reports whether
// one could not be. armed remembers the last outcome per directory, so that
// only changes are logged.
func (c *Cleaner) arm(w *fsnotify.Watcher, armed map[string]bool) (missing bool) {
	list := w.WatchList()
	for _, dir := range []string{c.cfg.LogDir, c.cfg.PodLogDir} {
		if slices.Contains(list, dir) {
			continue
		}
		err := w.Add(dir)
		if prev, logged := armed[dir]; !logged || prev != (err == nil) {
			if err == nil {
				c.log.Info().Str("path", dir).Msg("watching")
			} else {
				c.log.Warn().Str("path", dir).Err(err).Msg("cannot watch, retrying")
			}
		}
		armed[dir] = err == nil
		if err != nil {
			missing = true
			if !errors.Is(err, fs.ErrNotExist) {
				c.metrics.error("watch")
			}
		}
	}
	return missing
}

// follow asks for a pass on each projection change, at most one per
// minGap: changes meanwhile coalesce in the channel, one Notify after.
func (c *Cleaner) follow(ctx context.Context) {
	gap := c.clock.NewTimer(0)
	defer gap.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.changes:
			c.Notify()
		}
		gap.Reset(c.minGap)
		select {
		case <-ctx.Done():
			return
		case <-gap.C():
		}
	}
}
