package natsbus

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
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
	InProcessConn() (net.Conn, error)
	Shutdown()
	WaitForShutdown()
}

// Embedded keeps the agent's embedded NATS server running. The server
// never listens itself: the agent talks to it in process (InProcessConn),
// and Embedded owns the client listener (EmbeddedOptions.Listen), handing
// each connection it accepts to the server in process. So a taken address
// stops only local tools (gcagent watch, ctl), never the server, the
// agent's events or the fleet keep list in its store; and a foreign
// process holding the port never receives the agent's events. A server
// that cannot start (its store unusable) and a listener that cannot bind
// are both retried in the background with jittered backoff until they
// work or Close. It is safe for concurrent use.
type Embedded struct {
	o        EmbeddedOptions
	min, max time.Duration
	onUp     func()
	onListen func(clientURL string)
	log      zerolog.Logger
	up       prometheus.Gauge
	failures prometheus.Counter
	// listening and listenFailures are the client listener's.
	listening      prometheus.Gauge
	listenFailures prometheus.Counter

	mu      sync.Mutex
	srv     runningServer
	lastErr error
	since   time.Time // first failure of the current run of failures
	ln      net.Listener
	url     string // the listener's client URL ("" while not listening)
	// listenErr and listenSince are the listener's current run of failures.
	listenErr   error
	listenSince time.Time
	conns       map[net.Conn]struct{} // accepted, handed to the server
	stop        chan struct{}
	done        chan struct{}
	accepting   sync.WaitGroup
}

// EmbeddedRunOptions configures RunEmbedded beyond the server's own options.
type EmbeddedRunOptions struct {
	// RetryMin is the first wait after a failed start or bind; it doubles up to RetryMax, with jitter. Default 500ms.
	RetryMin time.Duration
	// RetryMax is the longest wait between attempts. Default 10s.
	RetryMax time.Duration
	// OnUp is called (in its own goroutine) each time the server starts:
	// in-process connections work from then on. Default none.
	OnUp func()
	// OnListen is called (in its own goroutine) with the client URL each
	// time the listener binds: local tools can connect from then on.
	// Default none.
	OnListen func(clientURL string)
	// Registerer receives gcagent_natsbus_embedded_up,
	// gcagent_natsbus_embedded_start_failures_total,
	// gcagent_natsbus_embedded_listening and
	// gcagent_natsbus_embedded_listen_failures_total. Default: not registered.
	Registerer prometheus.Registerer
}

// RunEmbedded validates o, tries once to start the server and to bind its
// listener, and returns; what failed is retried in the background. It
// fails only on invalid options (or metrics the registerer refuses).
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
	e := &Embedded{o: o, min: ro.RetryMin, max: ro.RetryMax, onUp: ro.OnUp, onListen: ro.OnListen,
		log: o.Logger.With().Str("component", "natsbus").Str("listen", o.Listen).Logger(),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_natsbus_embedded_up",
			Help: "1 while the embedded NATS server runs (the agent publishes to it in process, whether or not its client address could be bound), 0 while the agent retries starting it.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_embedded_start_failures_total",
			Help: "Failed attempts to start the embedded NATS server (its store unusable, JetStream not starting).",
		}),
		listening: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_natsbus_embedded_listening",
			Help: "1 while the embedded NATS server's client address (--embedded-nats-listen) accepts local tools, 0 while the agent retries binding it.",
		}),
		listenFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_natsbus_embedded_listen_failures_total",
			Help: "Failed attempts to bind the embedded NATS server's client address (--embedded-nats-listen taken, most often).",
		}),
		conns: map[net.Conn]struct{}{},
		stop:  make(chan struct{}), done: make(chan struct{}),
	}
	if ro.Registerer != nil {
		for _, c := range []prometheus.Collector{e.up, e.failures, e.listening, e.listenFailures} {
			if err := ro.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	if e.tryServer() && e.tryListen() {
		close(e.done)
		return e, nil
	}
	go e.retry()
	return e, nil
}

// tryServer makes one start attempt (true when the server runs).
func (e *Embedded) tryServer() bool {
	e.mu.Lock()
	running := e.srv != nil
	e.mu.Unlock()
	if running {
		return true
	}
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
	if e.closed() {
		s.Shutdown()
		s.WaitForShutdown()
		return true
	}
	if e.lastErr != nil {
		e.log.Info().Float64("down_for_s", time.Since(e.since).Seconds()).Msg("embedded NATS server started after retrying")
	} else {
		// One line for the server's banner, which goes to debug.
		e.log.Info().Int64("max_store_bytes", e.o.MaxStore).Msg("embedded NATS server started")
	}
	e.srv, e.lastErr = s, nil
	e.up.Set(1)
	if e.onUp != nil {
		go e.onUp() // not under e.mu: it may connect through InProcessConn
	}
	return true
}

// tryListen makes one attempt to bind the client address (true when it
// listens) and starts accepting on it.
func (e *Embedded) tryListen() bool {
	host, port, _ := e.o.hostPort() // validated
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(max(port, 0))))
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.listenFailures.Inc()
		if e.listenErr == nil {
			e.listenSince = time.Now()
		}
		if e.listenErr == nil || e.listenErr.Error() != err.Error() {
			e.log.Warn().Err(err).Msg("embedded NATS server cannot listen on its client address; it runs in process: GC, events and the fleet keep list go on, local tools cannot reach it; retrying with backoff")
		}
		e.listenErr = err
		return false
	}
	if e.closed() {
		_ = ln.Close()
		return true
	}
	e.ln, e.url = ln, "nats://"+ln.Addr().String()
	if e.listenErr != nil {
		e.log.Info().Float64("failing_for_s", time.Since(e.listenSince).Seconds()).Str("url", e.url).
			Msg("embedded NATS server listening after retrying")
	} else {
		e.log.Info().Str("url", e.url).Msg("embedded NATS server listening")
	}
	e.listenErr = nil
	e.listening.Set(1)
	e.accepting.Add(1)
	go e.accept(ln)
	if e.onListen != nil {
		go e.onListen(e.url)
	}
	return true
}

// closed reports whether Close was called; the caller holds e.mu or not.
func (e *Embedded) closed() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// retry tries again with jittered exponential backoff until the server
// runs and listens, or Close.
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
		if e.tryServer() && e.tryListen() {
			return
		}
		wait = min(2*wait, e.max)
	}
}

// accept hands each connection ln accepts to the server, in process,
// until ln is closed.
func (e *Embedded) accept(ln net.Listener) {
	defer e.accepting.Done()
	delay := 10 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if e.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most often: as nats-server's own
			// accept loop, wait a little and go on.
			e.log.Debug().Err(err).Msg("embedded NATS listener accept")
			time.Sleep(delay)
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 10 * time.Millisecond
		e.serve(c)
	}
}

// serve relays c to an in-process connection of the server, both ways,
// until either side closes. Authentication is the server's, as for a
// client of its own listener.
func (e *Embedded) serve(c net.Conn) {
	sc, err := e.InProcessConn()
	if err != nil {
		_ = c.Close()
		return
	}
	e.mu.Lock()
	if e.closed() {
		e.mu.Unlock()
		_ = c.Close()
		_ = sc.Close()
		return
	}
	e.conns[c], e.conns[sc] = struct{}{}, struct{}{}
	e.mu.Unlock()
	var once sync.Once
	end := func() {
		once.Do(func() {
			_ = c.Close()
			_ = sc.Close()
			e.mu.Lock()
			delete(e.conns, c)
			delete(e.conns, sc)
			e.mu.Unlock()
		})
	}
	go func() { _, _ = io.Copy(sc, c); end() }()
	go func() { _, _ = io.Copy(c, sc); end() }()
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

// ClientURL returns the URL local tools reach the server at, or "" while
// the server does not run or its address is not bound.
func (e *Embedded) ClientURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return ""
	}
	return e.url
}

// Running reports whether the server runs (in process; it may not listen).
func (e *Embedded) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv != nil
}

// Problem returns what does not work and since when ("" when the server
// runs and listens), for /readyz and status: the server not running, or
// its client address not bound (which names the address and the error).
func (e *Embedded) Problem() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.srv == nil && e.lastErr != nil:
		return "embedded NATS server not running since " + e.since.UTC().Format(time.RFC3339) +
			" (" + e.lastErr.Error() + "); retrying; GC goes on and events wait in the outbox"
	case e.srv != nil && e.ln == nil && e.listenErr != nil:
		return "embedded NATS server cannot listen on " + e.o.Listen + " since " + e.listenSince.UTC().Format(time.RFC3339) +
			" (" + e.listenErr.Error() + "); retrying; it runs in process: GC, events and the fleet keep list go on; local tools (gcagent watch, ctl) cannot reach it meanwhile"
	}
	return ""
}

// Close stops retrying, closes the listener and every connection it
// accepted, and shuts the server down.
func (e *Embedded) Close() {
	e.mu.Lock()
	if !e.closed() {
		close(e.stop)
	}
	s, ln := e.srv, e.ln
	e.srv, e.ln, e.url = nil, nil, ""
	conns := make([]net.Conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	<-e.done
	if ln != nil {
		_ = ln.Close()
	}
	e.accepting.Wait()
	for _, c := range conns {
		_ = c.Close()
	}
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	e.up.Set(0)
	e.listening.Set(0)
}
