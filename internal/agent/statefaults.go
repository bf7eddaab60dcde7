package agent

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/prometheus/client_golang/prometheus"
)

// stateResetLost says what a reset of the state file loses, in the log line
// and the event: everything containerd does not keep itself.
const stateResetLost = "LRU history: first seen and last used times of images, exit times of containers whose tasks are gone; the usage trace gcagent replay reads"

// reportStateReset registers gcagent_state_resets_total and, when the state
// file was unreadable and moved aside at start (r not nil), says so once on
// each channel an operator watches: an error log line, the counter, and an
// agent.state_reset event. GC goes on from a projection rebuilt from
// containerd, so images are aged from now: nothing is deleted early, some
// later than their history would have allowed.
func (a *agent) reportStateReset(r *projection.Reset) {
	resets := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gcagent_state_resets_total",
		Help: "State files found unreadable at start, moved aside and rebuilt from containerd (LRU history lost).",
	})
	a.reg.MustRegister(resets)
	if r == nil {
		return
	}
	resets.Inc()
	a.log.Error().Err(r.Err).Str("path", r.Path).Str("moved_to", r.MovedTo).Str("lost", stateResetLost).
		Msg("state file unreadable: moved aside, projection rebuilt from containerd, LRU history lost")
	_ = a.pub.Publish(gc.Action{Kind: "agent", Action: "state_reset", Subject: a.cfg.NodeName,
		Key: filepath.Base(r.MovedTo), // one event per file moved aside
		Data: schema.StateReset{Path: r.Path, MovedTo: r.MovedTo, Error: r.Err.Error(), Lost: stateResetLost,
			At: r.At.Format(time.RFC3339Nano)}})
}

// journalDetail is the /readyz line for a state disk that fails writes, or
// "" when the journal works. It is detail, not a readiness failure: GC goes
// on, and the projection in memory stays right.
func (a *agent) journalDetail() string {
	f := a.live.JournalFault()
	if f == nil {
		return ""
	}
	return fmt.Sprintf("journal: %d failed writes since %s, last: %s (GC goes on; history since then is in memory only until a write succeeds)",
		f.Failures, f.Since.UTC().Format(time.RFC3339), f.Err)
}
