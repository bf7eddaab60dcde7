package logs

import (
	"github.com/gcagent/gcagent/internal/promzero"
	"github.com/prometheus/client_golang/prometheus"
)

// The label values the counters are created with at start.
var (
	metricKinds    = []string{string(KindSymlink), string(KindPodDir)}
	metricRemovals = []string{string(ReasonContainerExited), string(ReasonContainerUnknown), string(ReasonPodGone), string(ReasonPodUnknown)}
	metricErrorOps = []string{"scan", "remove", "publish", "watch"}
)

// Metrics are the Cleaner's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	removed *prometheus.CounterVec   // kind, reason
	skipped *prometheus.GaugeVec     // kind, reason
	errors  *prometheus.CounterVec   // op
	latency *prometheus.HistogramVec // kind
	passes  prometheus.Counter
	// unverifiable: links kept by the last pass because their targets lie
	// outside the pod log dir the agent sees.
	unverifiable prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered), the counters with every known label value at zero. It fails
// if reg already holds them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_logs_removed_total",
			Help: "Log symlinks and pod log dirs removed, by kind and reason (dry runs excluded).",
		}, []string{"kind", "reason"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gcagent_logs_skipped",
			Help: "Entries kept by the last pass, by kind and reason (waiting ones have reason grace).",
		}, []string{"kind", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_logs_errors_total",
			Help: "Errors, by operation: scan, remove, publish, watch.",
		}, []string{"op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gcagent_logs_removal_duration_seconds",
			Help:    "Time from an entry becoming removable to its removal.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10ms .. ~44min
		}, []string{"kind"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_logs_passes_total",
			Help: "Full scan-plan-apply passes over both directories.",
		}),
		unverifiable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_logs_links_unverifiable",
			Help: "Log links kept by the last pass because their targets lie outside the pod log dir the agent sees (set --host-pod-log-dir).",
		}),
	}
	promzero.Labels(m.removed.WithLabelValues, metricKinds, metricRemovals)
	promzero.Labels(m.errors.WithLabelValues, metricErrorOps)
	promzero.Labels(m.latency.WithLabelValues, metricKinds)
	m.zeroSkipped()
	if reg != nil {
		for _, c := range []prometheus.Collector{m.removed, m.skipped, m.errors, m.latency, m.passes, m.unverifiable} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) pass(p Plan) {
	if m == nil {
		return
	}
	m.passes.Inc()
	n, _ := unverifiable(p)
	m.unverifiable.Set(float64(n))
	m.skipped.Reset()
	m.zeroSkipped()
	for _, d := range p.Decisions {
		if d.Action != ActionRemove {
			m.skipped.WithLabelValues(string(d.Kind), string(d.Reason)).Inc()
		}
	}
}

// zeroSkipped makes the entries waiting for their grace (of each kind) a
// series at zero, so the gauge exists when nothing is kept.
func (m *Metrics) zeroSkipped() {
	promzero.Labels(m.skipped.WithLabelValues, metricKinds, []string{string(ReasonGrace)})
}

func (m *Metrics) removal(d Decision, seconds float64) {
	if m == nil {
		return
	}
	m.removed.WithLabelValues(string(d.Kind), string(d.Reason)).Inc()
	m.latency.WithLabelValues(string(d.Kind)).Observe(seconds)
}

func (m *Metrics) error(op string) {
	if m != nil {
		m.errors.WithLabelValues(op).Inc()
	}
}
