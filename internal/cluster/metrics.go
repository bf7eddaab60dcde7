package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/promzero"
	"github.com/gcagent/gcagent/nodeevents"
)

// metrics are the component's own, gcagent_cluster_*; every family exists
// from the start with its known labels at zero.
type metrics struct {
	leader        prometheus.Gauge
	kindSynced    *prometheus.GaugeVec
	kindErrors    *prometheus.CounterVec
	invalidRefs   prometheus.Counter
	state         *prometheus.GaugeVec
	images        prometheus.Gauge
	workloads     prometheus.Gauge
	releasing     prometheus.Gauge
	released      prometheus.Counter
	writes        *prometheus.CounterVec
	writeFailures prometheus.Counter
	lastPublish   prometheus.Gauge

	eventsReceived     *prometheus.CounterVec
	eventsSkipped      *prometheus.CounterVec
	eventWrites        *prometheus.CounterVec
	eventWriteFailures *prometheus.CounterVec
	eventsPending      prometheus.Gauge
	eventsLag          prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, kinds []string) *metrics {
	const ns = "gcagent_cluster"
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "leader",
			Help: "1 while this replica leads (writes the keep list and the Events), else 0."}),
		kindSynced: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "informer_synced",
			Help: "1 once the informer of a kind has synced."}, []string{"kind"}),
		kindErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "informer_errors_total",
			Help: "List and watch errors of a kind's informer (RBAC denied, API server down)."}, []string{"kind"}),
		invalidRefs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "invalid_references_total",
			Help: "Image references in workloads that name no image (left off the list)."}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "keep_list_state",
			Help: "1 for the state of the published cluster keep list (syncing, complete, incomplete)."}, []string{"state"}),
		images: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "keep_list_images",
			Help: "Images on the published cluster keep list (those waiting out the grace included)."}),
		workloads: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "keep_list_workloads",
			Help: "Workloads that declare images."}),
		releasing: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "keep_list_releasing_images",
			Help: "Images on the list that no workload names any more, waiting out the grace."}),
		released: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "keep_list_released_total",
			Help: "Images released from the list after the grace."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "keep_list_writes_total",
			Help: "Values written to the keep list's bucket, by key kind (head, shard)."}, []string{"key"}),
		writeFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "keep_list_write_failures_total",
			Help: "Writes to the keep list's bucket that failed."}),
		lastPublish: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "keep_list_last_publish_timestamp_seconds",
			Help: "When this replica last wrote the list's head (0: never; only the leader writes)."}),
		eventsReceived: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_recorded_total",
			Help: "Agent actions recorded as Events on their Node, by reason (before the recorder's aggregation)."}, []string{"reason"}),
		eventsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_skipped_total",
			Help: "Agent actions of a shown type not written as an Event, by cause (undecodable, unknown-node, rate-limited: the node's and reason's budget spent, not-written: the API server refused it)."}, []string{"cause"}),
		eventWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "event_writes_total",
			Help: "Events written to the API server, by verb (create, patch, update)."}, []string{"verb"}),
		eventWriteFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "event_write_failures_total",
			Help: "Event writes the API server did not take, by verb."}, []string{"verb"}),
		eventsPending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "events_pending",
			Help: "Agent actions in the stream not yet bridged (the consumer's pending and unacknowledged)."}),
		eventsLag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "events_lag_seconds",
			Help: "Age of the last action bridged when it was read."}),
	}
	promzero.Labels(m.kindSynced.WithLabelValues, kinds)
	promzero.Labels(m.kindErrors.WithLabelValues, kinds)
	promzero.Labels(m.state.WithLabelValues, []string{string(declared.Syncing), string(declared.Complete), string(declared.Incomplete)})
	promzero.Labels(m.writes.WithLabelValues, []string{"head", "shard"})
	promzero.Labels(m.eventsReceived.WithLabelValues, nodeevents.Reasons)
	promzero.Labels(m.eventsSkipped.WithLabelValues, []string{"undecodable", "unknown-node", "rate-limited", "not-written"})
	promzero.Labels(m.eventWrites.WithLabelValues, []string{"create", "patch", "update"})
	promzero.Labels(m.eventWriteFailures.WithLabelValues, []string{"create", "patch", "update"})
	reg.MustRegister(m.leader, m.kindSynced, m.kindErrors, m.invalidRefs, m.state, m.images, m.workloads, m.releasing, m.released,
		m.writes, m.writeFailures, m.lastPublish, m.eventsReceived, m.eventsSkipped, m.eventWrites, m.eventWriteFailures,
		m.eventsPending, m.eventsLag,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
