package gc

import (
	"github.com/gcagent/gcagent/internal/promzero"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ContainerMetrics are the container GC's Prometheus metrics. A nil
// *ContainerMetrics records nothing.
type ContainerMetrics struct {
	removed *prometheus.CounterVec   // namespace, kind, reason
	kept    *prometheus.CounterVec   // liveness
	errors  *prometheus.CounterVec   // op
	latency *prometheus.HistogramVec // kind
	won     *prometheus.CounterVec   // kind
	passes  prometheus.Counter
	next    prometheus.Gauge
}

// The label values container GC's counters are created with at start.
var (
	containerKinds    = []string{"native", "container", "sandbox"}
	containerRemovals = []string{string(ReasonPerUnitCap), string(ReasonGlobalCap), string(ReasonSandboxOrphaned), string(ReasonTTLExpired), string(ReasonPodDeleted)}
	containerLiveness = []string{"running", "created", "has-containers", "unknown"}
	containerErrorOps = []string{"recheck", "remove", "publish"}
)

// NewContainerMetrics creates the metrics and registers them with reg (nil:
// not registered), with every known label value at zero (namespaces: the
// managed ones known at start). It fails if reg already holds them.
func NewContainerMetrics(reg prometheus.Registerer, namespaces ...string) (*ContainerMetrics, error) {
	m := &ContainerMetrics{
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_container_gc_containers_removed_total",
			Help: "Dead containers and sandboxes removed, by containerd namespace, kind (native, container, sandbox) and reason (dry runs excluded).",
		}, []string{"namespace", "kind", "reason"}),
		kept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_container_gc_kept_on_recheck_total",
			Help: "Planned removals the runtime re-check refused, by what the runtime said (running, created, has-containers, unknown).",
		}, []string{"liveness"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_container_gc_errors_total",
			Help: "Container GC errors, by operation: recheck, remove, publish.",
		}, []string{"op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gcagent_container_gc_removal_duration_seconds",
			Help:    "Time from a dead container becoming removable under the policy to its removal.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12), // 5ms .. ~5min
		}, []string{"kind"}),
		won: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_container_gc_owner_won_total",
			Help: "Planned removals that the container's owner (a client such as ctr run --rm) deleted first, by kind.",
		}, []string{"kind"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_container_gc_passes_total",
			Help: "Container GC passes (plan and apply) run.",
		}),
		next: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_container_gc_next_eligible_timestamp_seconds",
			Help: "When the timer fires next for a container passing its TTL (0: none armed).",
		}),
	}
	promzero.Labels(m.removed.WithLabelValues, namespaces, containerKinds, containerRemovals)
	promzero.Labels(m.kept.WithLabelValues, containerLiveness)
	promzero.Labels(m.errors.WithLabelValues, containerErrorOps)
	promzero.Labels(m.latency.WithLabelValues, containerKinds)
	promzero.Labels(m.won.WithLabelValues, containerKinds)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.removed, m.kept, m.errors, m.latency, m.won, m.passes, m.next} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *ContainerMetrics) error(op string) {
	if m != nil {
		m.errors.WithLabelValues(op).Inc()
	}
}

func (m *ContainerMetrics) ownerWon(kind string) {
	if m != nil {
		m.won.WithLabelValues(kind).Inc()
	}
}

func (m *ContainerMetrics) pass(next time.Time) {
	if m == nil {
		return
	}
	m.passes.Inc()
	if next.IsZero() {
		m.next.Set(0)
	} else {
		m.next.Set(float64(next.UnixNano()) / 1e9)
	}
}
