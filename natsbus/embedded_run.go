package natsbus

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Embedded retry defaults.
const (
	DefaultEmbeddedRetryMin = 500 * time.Millisecond
	DefaultEmbeddedRetryMax = 10 * time.Second
)

// errEmbeddedDown is what the agent's in-process connection gets while the
// embedded server is not running; nats.go retries it like a refused dial.
var errEmbeddedDown = errors.New("natsbus: embedded NATS server is not running")

// runningServer is what Embedded needs of a started nats-server
// (*server.Server), so that a binary without the server builds.
type runningServer interface {
	ClientURL() string
	InProcessConn() (net.Conn, error)
	Shutdown()
	WaitForShutdown()
}

// Embedded keeps the agent's embedded NATS server running. A server that
// cannot start (its port is taken, most often) must not stop GC: Embedded
// retries in the background with jittered backoff until it starts or Close.
// The agent connects to it in process (InProcessConn), never through the
// port, so a foreign process listening there never receives its events.
// It is safe for concurrent use.
type Embedded struct {
	o        EmbeddedOptions
	min, max time.Duration
	onUp     func(clientURL string)
	log      zerolog.Logger
	up       prometheus.Gauge
	failures prometheus.Counter

	mu      sync.Mutex
	srv     runningServer
	lastErr error
	since   time.Time // first failure of the current run of failures
	stop    chan struct{}
	done    chan struct{}
}

// EmbeddedRunOptions configures RunEmbedded beyond the server's own options.
type EmbeddedRunOptions struct {
	// RetryMin is the first wait after a failed start; it doubles up to RetryMax, with jitter. Default 500ms.
	RetryMin time.Duration
	// RetryMax is the longest wait between start attempts. Default 10s.
	RetryMax time.Duration
	// OnUp is called (in its own goroutine) with the server's client URL
	// each time the server starts. Default none.
	OnUp func(clientURL string)
	// Registerer receives gcagent_natsbus_embedded_up and
	// gcagent_natsbus_embedded_start_failures_total. Default: not registered.
	Registerer prometheus.Registerer
}

// RunEmbedded validates o, tries to start the server once and returns; when
// that attempt fails it keeps trying in the background. It fails only on
// invalid options (or metrics the registerer refuses).
func RunEmbedded(o EmbeddedOptions, ro EmbeddedRunOptions) (*Embedded, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if ro.RetryMin <= 0 {
		ro.RetryMin = DefaultEmbeddedRetryMin
	}
	if ro.RetryMax < ro.RetryMin {
		ro.RetryMax = max(DefaultEmbeddedRetryMax, ro.RetryMin)
	}
	e := &Embedded{o: o, min: ro.RetryMin, max: ro.RetryMax, onUp: ro.OnUp,
		log: o.Logger.With().Str("component", "natsbus").Str("listen", o.Listen).Logger(),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_natsbus_embedded_up",
			Help: "1 while the embedded NATS server runs and listens, 0 while the agent retries starting it.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_embedded_start_failures_total",
			Help: "Failed attempts to start the embedded NATS server (its port taken, its store unusable).",
		}),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	if ro.Registerer != nil {
		for _, c := range []prometheus.Collector{e.up, e.failures} {
			if err := ro.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if e.try() {
		close(e.done)
		return e, nil
	}
	go e.retry()
	return e, nil
}

// try makes one start attempt and records its outcome.
func (e *Embedded) try() bool {
	s, err := startServer(e.o)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.failures.Inc()
		if e.lastErr == nil {
			e.since = time.Now()
		}
		if e.lastErr == nil || e.lastErr.Error() != err.Error() {
			e.log.Error().Err(err).Msg("embedded NATS server cannot start; GC goes on, events wait in the outbox, retrying with backoff")
		}
		e.lastErr = err
		return false
	}
	select {
	case <-e.stop: // closed meanwhile
		s.Shutdown()
		s.WaitForShutdown()
		return true
	default:
	}
	if e.lastErr != nil {
		e.log.Info().Float64("down_for_s", time.Since(e.since).Seconds()).Str("url", s.ClientURL()).Msg("embedded NATS server started after retrying")
	} else {
		// One line for the server's banner, which goes to debug.
		e.log.Info().Str("url", s.ClientURL()).Int64("max_store_bytes", e.o.MaxStore).
			Msg("embedded NATS server started")
	}
	e.srv, e.lastErr = s, nil
	e.up.Set(1)
	if e.onUp != nil {
		go e.onUp(s.ClientURL()) // not under e.mu: it may connect through InProcessConn
	}
	return true
}

// retry tries again with jittered exponential backoff until a start works or Close.
func (e *Embedded) retry() {
	defer close(e.done)
	wait := e.min
	for {
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-e.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if e.try() {
			return
		}
		wait = min(2*wait, e.max)
	}
}

// InProcessConn connects a client to the running server without the
// network (nats.InProcessServer); it fails while the server is not running.
func (e *Embedded) InProcessConn() (net.Conn, error) {
	e.mu.Lock()
	s := e.srv
	e.mu.Unlock()
	if s == nil {
		return nil, errEmbeddedDown
	}
	return s.InProcessConn()
}

// ClientURL returns the running server's client URL, or "" while it is
// not running.
func (e *Embedded) ClientURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// Problem returns why the server is not running and since when ("" when it
// runs), for /readyz and status.
func (e *Embedded) Problem() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil || e.lastErr == nil {
		return ""
	}
	return "embedded NATS server not running since " + e.since.UTC().Format(time.RFC3339) +
		" (" + e.lastErr.Error() + "); retrying; GC goes on and events wait in the outbox"
}

// Close stops retrying and shuts the server down.
func (e *Embedded) Close() {
	e.mu.Lock()
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	s := e.srv
	e.srv = nil
	e.mu.Unlock()
	<-e.done
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	e.up.Set(0)
}
