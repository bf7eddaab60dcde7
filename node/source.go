package node

import (
	"github.com/gcagent/gcagent/internal/promzero"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/streak"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Options configures a Source.
type Options struct {
	// Client talks to containerd; it reconnects by itself after a restart.
	Client *client.Client
	// CRI, if set, tells exited CRI containers from never-started ones when
	// a listing finds them without a task (CRI deletes the task on exit).
	CRI runtime.RuntimeServiceClient
	// Namespaces to follow. Default k8s.io only.
	Namespaces events.Namespaces
	// ResyncInterval is the period of full listings, jittered by ±10%.
	// Default 5m. Events are hints; the listing is the truth.
	ResyncInterval time.Duration
	// QueueSize bounds the envelopes waiting for enrichment. When it
	// overflows, envelopes are dropped and a full listing repairs the state.
	// Default 65536.
	QueueSize int
	// KnownFacts returns what the projection already holds for a target
	// digest (zero if none), so a listing does not read the content again.
	KnownFacts func(digest string) ImageFacts
	// KnownContainer returns the facts the projection holds of CRI
	// container id of namespace ns, if it holds that very container (the
	// same creation time), so the listings that follow a start or a
	// reconnect, which readiness waits for, decode the spec and CRI
	// metadata of only the containers they do not know. Periodic and repair
	// listings decode every one: a fact a failed lookup missed is mended
	// within ResyncInterval.
	KnownContainer func(ns, id string, created time.Time) (ContainerFacts, bool)
	// Now is the agent's clock (internal/clock: no wall-clock step moves
	// it); default time.Now. Event times are bounded by it at receipt
	// (see stampAt).
	Now func() time.Time
	// StampSkew, for end-to-end tests only, is the skew added to a time
	// containerd stamped (event times, exits, creations) at that host time
	// (clock.Skew.At): it emulates steps of the host's wall clock as
	// containerd would see them. Nil: none.
	StampSkew  func(time.Time) time.Duration
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Source follows containerd and emits domain events, each scoped to its
// namespace: a Listing of every managed namespace and a Round after every
// (re)subscribe and periodically, a Listing of a namespace when it first
// appears, and one event per relevant envelope in between. It never exits
// because containerd went away.
type Source struct {
	o         Options
	connected atomic.Bool
	// failures is the run of failed attempts to follow containerd, for
	// the log (Run's goroutine).
	failures streak.Streak
	// listed are the namespaces the current session has listed; the
	// session's goroutine only.
	listed map[string]bool
	// unsure counts, by namespace, the containers the last listing found
	// without a task and CRI could not tell the state of (criStates):
	// another listing follows soon. The session's goroutine only.
	unsure map[string]int
	tops   *imageTops // nil without a client
	m      sourceMetrics
	// daemon is containerd's UUID (Containerd); daemonFailed says the
	// last read failed (the session's goroutine only).
	daemon       atomic.Pointer[string]
	daemonFailed bool
}

type sourceMetrics struct {
	received, ignored     *prometheus.CounterVec
	unknown, malformed    prometheus.Counter
	dropped, lookupErrors prometheus.Counter
	reconnects            prometheus.Counter
	listings              *prometheus.CounterVec
	listSeconds           prometheus.Histogram
}

// NewSource returns a Source; Run starts it.
func NewSource(o Options) *Source {
	if !o.Namespaces.All && len(o.Namespaces.Names) == 0 {
		o.Namespaces.Names = []string{events.CRINamespace}
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 5 * time.Minute
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 65536
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StampSkew == nil {
		o.StampSkew = func(time.Time) time.Duration { return 0 }
	}
	if o.KnownFacts == nil {
		o.KnownFacts = func(string) ImageFacts { return ImageFacts{} }
	}
	if o.KnownContainer == nil {
		o.KnownContainer = func(string, string, time.Time) (ContainerFacts, bool) { return ContainerFacts{}, false }
	}
	s := &Source{o: o, unsure: map[string]int{}}
	if o.Client != nil {
		s.tops = newImageTops(o.Client.ContentStore())
	}
	s.m = sourceMetrics{
		received:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_received_total", Help: "containerd envelopes received, by topic."}, []string{"topic"}),
		ignored:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_ignored_total", Help: "Envelopes received but not needed, by topic."}, []string{"topic"}),
		unknown:      prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_unknown_total", Help: "Envelopes of unknown type, dropped."}),
		malformed:    prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_malformed_total", Help: "Envelopes that could not be decoded, dropped."}),
		dropped:      prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_dropped_total", Help: "Envelopes dropped because the queue was full (a listing follows)."}),
		lookupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_lookup_errors_total", Help: "Failed lookups while enriching an envelope (a listing follows)."}),
		reconnects:   prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_reconnects_total", Help: "Subscriptions to containerd that were lost after the agent followed it (each is reopened); attempts that fail meanwhile are not counted."}),
		listings:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_listings_total", Help: "Full listings of containerd, by reason."}, []string{"reason"}),
		listSeconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gcagent_events_listing_duration_seconds", Help: "Time to list images, containers and tasks.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
	}
	// The counters exist from the start, at zero: for every topic the
	// agent subscribes to, and every reason to list.
	var subscribed []string
	for t := range knownTopics {
		if strings.HasPrefix(t, "/images/") || strings.HasPrefix(t, "/containers/") || strings.HasPrefix(t, "/tasks/") {
			subscribed = append(subscribed, t)
		}
	}
	promzero.Labels(s.m.received.WithLabelValues, subscribed)
	promzero.Labels(s.m.ignored.WithLabelValues, subscribed)
	promzero.Labels(s.m.listings.WithLabelValues, []string{"start", "reconnect", "periodic", "repair"})
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.m.received, s.m.ignored, s.m.unknown, s.m.malformed, s.m.dropped,
			s.m.lookupErrors, s.m.reconnects, s.m.listings, s.m.listSeconds)
	}
	return s
}

// Connected reports whether a subscription to containerd is open.
func (s *Source) Connected() bool { return s.connected.Load() }
