package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
	"github.com/rs/zerolog"
)

// sdNotifier sends one sd_notify state ("READY=1", "WATCHDOG=1", ...). In
// production it is daemon.SdNotify; it reports false when NOTIFY_SOCKET is
// not set.
type sdNotifier func(state string) (bool, error)

// systemdNotify tells systemd (Type=notify) that the agent is ready once the
// projection is synced, as the kubelet waits for all its sources, so that
// units ordered after gcagent start only when GC can act; and it feeds the
// watchdog only while the event loop answers, so that a wedged agent is
// restarted instead of silently no longer collecting.
type systemdNotify struct {
	notify   sdNotifier
	synced   func() bool
	changes  <-chan struct{} // a signal after each batch the projection applied
	watchdog time.Duration   // WatchdogSec; 0: no watchdog
	check    func() error    // nil when the event loop is healthy (loopHealth.check)
	log      zerolog.Logger
}

// newSystemdNotify returns nil when the agent was not started by systemd
// with Type=notify (no NOTIFY_SOCKET). Call it before the projection runs
// (it subscribes to it).
func (a *agent) newSystemdNotify(evs chan events.Scoped) *systemdNotify {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	log := a.log.With().Str("component", "systemd").Logger()
	if err != nil {
		log.Warn().Err(err).Msg("watchdog settings unreadable; watchdog not fed")
		wd = 0
	}
	health := &loopHealth{
		queued:  func() (int, int) { return len(evs), cap(evs) },
		view:    a.live.ViewAll,
		timeout: max(wd/4, 10*time.Millisecond),
	}
	return &systemdNotify{
		notify:   func(s string) (bool, error) { return daemon.SdNotify(false, s) },
		synced:   a.live.Synced,
		changes:  a.live.Subscribe(),
		watchdog: wd,
		check:    health.check,
		log:      log,
	}
}

// run sends READY=1 once after the projection is synced, WATCHDOG=1 every
// half watchdog period while the loop is healthy, and STOPPING=1 when ctx
// ends. It returns nil then.
func (s *systemdNotify) run(ctx context.Context) error {
	ready := false
	checkReady := func() {
		if ready || !s.synced() {
			return
		}
		ready = true
		if _, err := s.notify("READY=1\nSTATUS=projection synced, collecting"); err != nil {
			s.log.Error().Err(err).Msg("sd_notify READY failed")
			return
		}
		s.log.Info().Msg("told systemd: ready (projection synced)")
	}
	var tick <-chan time.Time
	if s.watchdog > 0 {
		t := time.NewTicker(s.watchdog / 2)
		defer t.Stop()
		tick = t.C
		s.log.Info().Float64("watchdog_s", s.watchdog.Seconds()).Msg("feeding the systemd watchdog while the event loop is healthy")
	}
	healthy := true
	feed := func() {
		err := s.check()
		switch {
		case err == nil:
			if !healthy {
				s.log.Info().Msg("event loop healthy again; feeding the watchdog")
			}
			_, _ = s.notify("WATCHDOG=1")
		case healthy:
			// Logged once per transition: systemd restarts the agent if
			// this lasts a whole watchdog period.
			s.log.Error().Err(err).Msg("event loop unhealthy; not feeding the watchdog")
		}
		healthy = err == nil
	}
	checkReady()
	if tick != nil {
		feed()
	}
	for {
		select {
		case <-ctx.Done():
			_, _ = s.notify("STOPPING=1")
			return nil
		case <-s.changes:
			checkReady()
		case <-tick:
			checkReady()
			feed()
		}
	}
}

// loopHealth judges whether the event loop is alive: the projection answers
// a read within timeout, and the queue of events in front of it is not full
// twice in a row with nothing applied in between. One probe runs at a time;
// a probe still blocked counts as unhealthy.
type loopHealth struct {
	queued func() (n, capacity int)
	// view reads every namespace's projection at once; it answers (with
	// none) before any namespace is listed.
	view    func(fn func([]*projection.State))
	timeout time.Duration

	inflight chan uint64 // the pending probe's answer, nil when none
	lastSeq  uint64
	wasFull  bool
}

// check returns nil when the loop is healthy, else why not. Not safe for
// concurrent use.
func (h *loopHealth) check() error {
	if h.inflight == nil {
		ch := make(chan uint64, 1)
		go h.view(func(states []*projection.State) { ch <- projection.SeqOf(states) })
		h.inflight = ch
	}
	var seq uint64
	select {
	case seq = <-h.inflight:
		h.inflight = nil
	case <-time.After(h.timeout):
		return fmt.Errorf("the projection did not answer a read within %s", h.timeout)
	}
	n, c := h.queued()
	full := c > 0 && n >= c
	stuck := full && h.wasFull && seq == h.lastSeq
	h.lastSeq, h.wasFull = seq, full
	if stuck {
		return fmt.Errorf("event queue full (%d events) and nothing applied since the last check", n)
	}
	return nil
}
