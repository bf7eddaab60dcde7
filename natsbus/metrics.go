package natsbus

import (
	"github.com/gcagent/gcagent/internal/promzero"
	"github.com/gcagent/gcagent/schema"
	"github.com/prometheus/client_golang/prometheus"
)

// Publishing modes reported by Publisher.Mode and the mode gauge.
const (
	// ModeJetStream means events are stored in the stream and removed from the outbox on ack.
	ModeJetStream = "jetstream"
	// ModeCore means the server has no JetStream (or no stream for the events): events are sent with core publish.
	ModeCore = "core"
	// ModeDisconnected means nothing can be sent now: events wait in the outbox.
	ModeDisconnected = "disconnected"
)

var modes = []string{ModeJetStream, ModeCore, ModeDisconnected}

// Metrics are the Publisher's Prometheus metrics; give each Publisher its own.
type Metrics struct {
	published   *prometheus.CounterVec
	acks        prometheus.Counter
	duplicates  prometheus.Counter
	republishes prometheus.Counter
	depth       prometheus.Gauge
	dropped     prometheus.Counter
	corrupt     prometheus.Counter
	intents     *prometheus.CounterVec
	mode        *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered); it fails when reg refuses one of them, e.g. a duplicate.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_natsbus_published_total",
			Help: "Events delivered to NATS (acked by JetStream, or flushed with core publish), by kind.",
		}, []string{"kind"}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_acks_total",
			Help: "JetStream publish acks received, duplicates included.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_duplicates_total",
			Help: "JetStream acks that reported a duplicate (a retry of an event already stored).",
		}),
		republishes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_republishes_total",
			Help: "Sends of an event this process had sent before without an ack.",
		}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_natsbus_outbox_depth",
			Help: "Events in the outbox waiting for delivery.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_outbox_dropped_total",
			Help: "Events dropped unsent from the outbox: over its entry, byte or age bound, or undecodable.",
		}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_outbox_corrupt_total",
			Help: "Outbox files that could not be opened and were moved aside (renamed outbox.db.corrupt-<time>) for an empty one; their events are lost.",
		}),
		intents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_natsbus_intents_total",
			Help: "Delete intents by outcome: recorded (before a delete), completed (turned into the event), abandoned (no delete), corrupt (undecodable, dropped).",
		}, []string{"outcome"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gcagent_natsbus_mode",
			Help: "1 for the current publishing mode (jetstream, core, disconnected), 0 for the others.",
		}, []string{"mode"}),
	}
	// The counters exist from the start, at zero, for every known label value.
	promzero.Labels(m.published.WithLabelValues, []string{schema.KindImage, schema.KindContainer, schema.KindLog, schema.KindGC, schema.KindAgent})
	promzero.Labels(m.intents.WithLabelValues, []string{"recorded", "completed", "abandoned", "corrupt"})
	if reg != nil {
		for _, c := range []prometheus.Collector{m.published, m.acks, m.duplicates, m.republishes, m.depth, m.dropped, m.corrupt, m.intents, m.mode} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) setMode(mode string) {
	for _, s := range modes {
		v := 0.0
		if s == mode {
			v = 1
		}
		m.mode.WithLabelValues(s).Set(v)
	}
}
