package agent

import (
	"net/http"
	"slices"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/streak"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// openTrace keeps the usage trace in the state file, unless
// --trace-max-age is 0, and records the agent's start in it. Call it
// before the projection is restored: each namespace's projection records
// into it from its restore on.
func openTrace(cfg Config, store *projection.Store, now time.Time, log zerolog.Logger, reg prometheus.Registerer) (*trace.Log, error) {
	if cfg.TraceMaxAge <= 0 {
		return nil, nil
	}
	m, err := trace.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	tl, err := store.OpenTrace(trace.Options{MaxAge: cfg.TraceMaxAge, MaxBytes: cfg.TraceMaxBytes, Metrics: m,
		Log: log.With().Str("component", "trace").Logger()})
	if err != nil {
		return nil, err
	}
	if err := tl.Put(trace.Record{T: now, Ev: trace.KindStart, Node: cfg.NodeName, Cluster: cfg.Cluster}); err != nil {
		log.Warn().Err(err).Str("component", "trace").Msg("usage trace: the start not recorded")
	}
	return tl, nil
}

// traceRecorder records image GC's disk measurements and policies in the
// usage trace (gc.ImageGCDeps.Trace).
type traceRecorder struct {
	log      *trace.Log
	dryRun   bool
	lg       zerolog.Logger
	failures *streak.Streak
}

func newTraceRecorder(tl *trace.Log, dryRun bool, log zerolog.Logger) *traceRecorder {
	return &traceRecorder{log: tl, dryRun: dryRun, lg: log, failures: &streak.Streak{}}
}

// TraceDisk records a measurement (the trace keeps what it needs), and
// compacts the trace when enough small records piled up.
func (r *traceRecorder) TraceDisk(at time.Time, d gc.DiskStats, trigger string) {
	_, err := r.log.Disk(at, trace.Disk{Capacity: d.CapacityBytes, Available: d.AvailableBytes}, trigger)
	if err == nil && r.log.CompactDue() {
		err = r.log.Compact(at)
	}
	r.note(at, err)
}

// TracePolicy records the policy of a pass when it changed.
func (r *traceRecorder) TracePolicy(at time.Time, p gc.ImagePolicy) {
	tp := tracePolicy(p)
	tp.DryRun = r.dryRun
	r.note(at, r.log.Policy(at, tp))
}

// note logs a failing write of the trace, a run of them at a backoff.
func (r *traceRecorder) note(at time.Time, err error) {
	if err == nil {
		r.failures.Recover()
		return
	}
	if log, n := r.failures.Fail(at, err.Error()); log {
		r.lg.Warn().Err(err).Int("failures", n).Msg("usage trace not written")
	}
}

// tracePolicy is p as the trace records it.
func tracePolicy(p gc.ImagePolicy) trace.Policy {
	return trace.Policy{High: p.HighThresholdPercent, Low: p.LowThresholdPercent, MinAge: trace.Duration(p.MinAge),
		MaxAge: trace.Duration(p.MaxAge), SandboxImages: slices.Clone(p.SandboxImages), KeepPatterns: slices.Clone(p.KeepPatterns),
		FleetKeepPatterns: slices.Clone(p.FleetKeep.Patterns)}
}

// serveTrace writes the usage trace as JSON lines (trace.Export): what
// `gcagent trace export` and `gcagent replay` read from a running agent.
func (a *agent) serveTrace(w http.ResponseWriter, _ *http.Request) {
	if a.trace == nil {
		http.Error(w, "the usage trace is off (--trace-max-age 0)", http.StatusNotFound)
		return
	}
	if err := a.live.FlushTrace(); err != nil {
		a.log.Warn().Err(err).Str("component", "trace").Msg("usage trace: pending records not written before an export")
	}
	recs, skipped, err := trace.Load(a.store.DB())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := trace.Record{Node: a.cfg.NodeName, Cluster: a.cfg.Cluster}
	if skipped.Any() {
		// Left out, and said in the export's header: the next
		// compaction drops what does not decode.
		h.Skipped = &skipped
		a.log.Warn().Str("component", "trace").Int("chunks", skipped.Chunks).Int("records", skipped.Records).
			Str("first", skipped.First).Msg("usage trace export: what could not be read is skipped")
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	_ = trace.Export(w, h, recs)
}
