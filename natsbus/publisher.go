package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Publisher defaults; a zero field in PublisherOptions takes these.
const (
	DefaultCluster = "default"
	DefaultStream  = "GCAGENT_EVT"
	// DefaultMaxAge is how long an event may wait in the outbox for NATS: the
	// longest retry horizon.
	DefaultMaxAge = 24 * time.Hour
	// DefaultDuplicateWindow equals DefaultMaxAge, so that any retry the outbox
	// still makes falls inside JetStream's duplicate window.
	DefaultDuplicateWindow = DefaultMaxAge
	DefaultMaxEntries      = 100_000
	DefaultMaxBytes        = 64 << 20
	DefaultStreamMaxAge    = 7 * 24 * time.Hour
	DefaultStreamMaxBytes  = 1 << 30
	DefaultAckTimeout      = 5 * time.Second
	DefaultCloseTimeout    = 5 * time.Second
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("natsbus: publisher closed")

// PublisherOptions configures a Publisher; zero fields take the defaults.
type PublisherOptions struct {
	// Cluster is the cluster name in subjects and the event source. Default "default".
	Cluster string
	// Node is the node name in subjects, the event source and the Gcagent-Node header. Required.
	Node string
	// StateDir holds the outbox file (StateDir/outbox.db). Required.
	StateDir string

	// Stream is the JetStream stream that stores the events. Default "GCAGENT_EVT".
	Stream string
	// NoCreateStream means the stream is managed elsewhere and must already exist. Default false.
	NoCreateStream bool
	// Domain is the JetStream domain that holds the stream: an agent on a
	// leaf node publishing into a hub's domain gives the hub's. Default: the
	// domain of the server it is connected to.
	Domain string
	// DuplicateWindow is the created stream's dedupe window; it must be at least MaxAge. Default 24h.
	DuplicateWindow time.Duration
	// StreamMaxAge bounds the age of events in a created stream. Default 7 days.
	StreamMaxAge time.Duration
	// StreamMaxBytes bounds the size of a created stream. Default 1 GiB.
	StreamMaxBytes int64
	// Replicas is the created stream's replica count (3 on a NATS cluster, so
	// losing a server loses no event). Default 1.
	Replicas int

	// MaxEntries bounds the outbox's event count; the oldest are dropped beyond it. Default 100000.
	MaxEntries int
	// MaxBytes bounds the outbox's stored bytes; the oldest are dropped beyond it. Default 64 MiB.
	MaxBytes int64
	// MaxAge is how long an event may wait in the outbox before it is dropped unsent. Default 24h.
	MaxAge time.Duration
	// AckTimeout bounds the wait for one JetStream ack or core flush. Default 5s.
	AckTimeout time.Duration
	// CloseTimeout bounds how long Close keeps sending what is left. Default 5s.
	CloseTimeout time.Duration

	// Logger receives the publisher's logs (component=natsbus is added). Default: no logs.
	Logger zerolog.Logger
	// Metrics receives the publisher's metrics. Default: unregistered metrics.
	Metrics *Metrics
	// Now is the clock for event times and outbox ages. Default time.Now.
	Now func() time.Time
}

func (o *PublisherOptions) setDefaults() {
	if o.Cluster == "" {
		o.Cluster = DefaultCluster
	}
	if o.Stream == "" {
		o.Stream = DefaultStream
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.DuplicateWindow == 0 {
		o.DuplicateWindow = max(DefaultDuplicateWindow, o.MaxAge)
	}
	if o.StreamMaxAge == 0 {
		o.StreamMaxAge = max(DefaultStreamMaxAge, o.DuplicateWindow)
	}
	if o.StreamMaxBytes == 0 {
		o.StreamMaxBytes = DefaultStreamMaxBytes
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	if o.CloseTimeout == 0 {
		o.CloseTimeout = DefaultCloseTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate reports the first invalid field of o, after defaults, as one clear error.
func (o PublisherOptions) Validate() error {
	o.setDefaults()
	switch {
	case o.Node == "":
		return errors.New("natsbus: node name is required")
	case !printable(o.Node) || !printable(o.Cluster):
		return fmt.Errorf("natsbus: cluster %q and node %q must be printable", o.Cluster, o.Node)
	case o.StateDir == "":
		return errors.New("natsbus: state dir is required")
	case SafeToken(o.Stream) != o.Stream || strings.ContainsAny(o.Stream, "/\\"):
		return fmt.Errorf("natsbus: invalid stream name %q", o.Stream)
	case !ValidDomain(o.Domain):
		return fmt.Errorf("natsbus: invalid JetStream domain %q: one subject token, no slashes", o.Domain)
	case o.MaxEntries < 0 || o.MaxBytes < 0 || o.MaxAge < 0 || o.AckTimeout < 0 || o.CloseTimeout < 0 ||
		o.DuplicateWindow < 0 || o.StreamMaxAge < 0 || o.StreamMaxBytes < 0:
		return errors.New("natsbus: outbox and stream bounds and timeouts must not be negative")
	case o.Replicas < 1 || o.Replicas > 5:
		return fmt.Errorf("natsbus: stream replicas %d: must be within 1..5", o.Replicas)
	case o.DuplicateWindow < o.MaxAge:
		return fmt.Errorf("natsbus: duplicate window %s is shorter than the outbox max age %s: a retry after a long outage could store an event twice", o.DuplicateWindow, o.MaxAge)
	case o.StreamMaxAge < o.DuplicateWindow:
		return fmt.Errorf("natsbus: stream max age %s is shorter than the duplicate window %s", o.StreamMaxAge, o.DuplicateWindow)
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Publisher publishes actions as CloudEvents through a durable outbox: Publish
// stores the event and returns, a sender goroutine delivers stored events in
// order and removes each only after JetStream acked it (or, without
// JetStream, after a core flush). It is safe for concurrent use.
type Publisher struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	ob   *outbox
	opts PublisherOptions
	log  zerolog.Logger
	m    *Metrics

	mode       atomic.Value // string: last mode the sender established
	connected  atomic.Bool  // the connection's state, kept by watch without taking the connection's lock
	maxPayload atomic.Int64 // the server's max payload, learned by the sender; 0 until known
	status     chan nats.Status
	wake       chan struct{} // nudges the sender after Publish
	statusWake chan struct{} // nudges the sender after a connection status change
	closing    chan struct{} // closed by Close
	closeOnce  sync.Once
	closeErr   error
	cancel     context.CancelFunc
	done       chan struct{} // closed when the sender has returned

	// Owned by the sender goroutine.
	sendMode   string // ModeJetStream or ModeCore once probed; "" means probe before sending
	reconnects uint64 // nc reconnect count at the last probe
	lastProbe  time.Time
	maxSent    uint64 // highest outbox sequence this process has sent
	lastErr    string // last error logged by the sender, to log each one once
	warnedDup  bool
	// sawJetStream: the stream answered once; from then on JetStream not
	// answering never means core publish (see jetStreamRequired).
	sawJetStream bool
	warnedCfg    bool
}

// NewPublisher opens the outbox under opts.StateDir and starts the sender on
// nc, which the caller keeps owning and closes after Close; events left in the
// outbox by an earlier Publisher are sent first. It fails on invalid options
// or when the outbox cannot be opened (for example, another process holds
// it). An outbox file that is corrupt is moved aside (see
// openOutboxOrMoveAside), logged and counted, and an empty one is used.
func NewPublisher(nc *nats.Conn, opts PublisherOptions) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsbus: nil NATS connection")
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := opts.Metrics
	if m == nil {
		m, _ = NewMetrics(nil) // never fails without a registerer
	}
	js, err := NewJetStream(nc, opts.Domain,
		jetstream.WithPublishAsyncTimeout(opts.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(2*batchSize))
	if err != nil {
		return nil, fmt.Errorf("natsbus: jetstream: %w", err)
	}
	ob, movedTo, why, err := openOutboxOrMoveAside(filepath.Join(opts.StateDir, OutboxFile), limits{
		maxEntries: opts.MaxEntries, maxBytes: opts.MaxBytes, maxAge: opts.MaxAge,
	}, opts.Now())
	if movedTo != "" {
		m.corrupt.Inc()
		opts.Logger.Error().Str("component", "natsbus").Err(why).Str("moved_to", movedTo).
			Msg("outbox cannot be opened: moved it aside and started an empty one; the events waiting in it are lost")
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		nc: nc, js: js, ob: ob, opts: opts, m: m,
		log:        opts.Logger.With().Str("component", "natsbus").Logger(),
		status:     nc.StatusChanged(),
		wake:       make(chan struct{}, 1),
		statusWake: make(chan struct{}, 1),
		closing:    make(chan struct{}),
		cancel:     cancel,
		done:       make(chan struct{}),
	}
	p.connected.Store(nc.IsConnected()) // after subscribing to changes, so none is missed
	p.mode.Store(ModeDisconnected)
	m.setMode(ModeDisconnected)
	n, _ := ob.depth()
	m.depth.Set(float64(n))
	if n > 0 {
		p.log.Info().Int("depth", n).Msg("outbox holds events from an earlier run; sending them first")
	}
	go p.watch()
	go p.run(ctx)
	return p, nil
}

// encode makes a's CloudEvent as of now and its JSON.
func (p *Publisher) encode(a Action, now time.Time) (CloudEvent, []byte, error) {
	ev, err := NewEvent(p.opts.Cluster, p.opts.Node, a, now)
	if err != nil {
		return ev, nil, err
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return ev, nil, fmt.Errorf("natsbus: marshal event %s: %w", ev.ID, err)
	}
	return ev, payload, nil
}

// Publish stores the action's event in the outbox (fsync'd) and returns
// without waiting for NATS; it fails only when the action is invalid, its
// event is larger than the outbox or NATS allow, the outbox cannot be written,
// or the Publisher is closed. When the outbox is over a bound it drops its
// oldest events, logs one error line and counts them.
func (p *Publisher) Publish(a Action) error {
	select {
	case <-p.closing:
		return ErrClosed
	default:
	}
	if a.Key == "" {
		a.Key = randomKey()
	}
	now := p.opts.Now()
	ev, payload, err := p.encode(a, now)
	if err != nil {
		return err
	}
	// Not nc.MaxPayload(): it takes the connection's lock, which a reconnect attempt holds while it dials.
	if mp := p.maxPayload.Load(); mp > 0 && int64(len(payload)) > mp {
		return fmt.Errorf("natsbus: event %s is %d bytes, more than the NATS max payload %d", ev.ID, len(payload), mp)
	}
	d, err := p.ob.append(entry{
		at: now, ID: ev.ID, Kind: a.Kind, Node: p.opts.Node, Event: payload,
		Subject: Subject(p.opts.Cluster, p.opts.Node, a.Kind, a.Action),
	})
	if err != nil {
		return err
	}
	p.reportDrop(d)
	n, _ := p.ob.depth()
	p.m.depth.Set(float64(n)) // also while disconnected, when the sender does not run
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// Mode returns how events are delivered now: ModeJetStream, ModeCore or
// ModeDisconnected (also before the first check of the server). The sender
// updates it on every connection status change; Mode never waits for NATS.
func (p *Publisher) Mode() string {
	if !p.connected.Load() {
		return ModeDisconnected
	}
	return p.mode.Load().(string)
}

// Depth returns the number of events waiting in the outbox.
func (p *Publisher) Depth() int {
	n, _ := p.ob.depth()
	return n
}

// Close stops accepting events, keeps sending what is left for at most
// CloseTimeout, then closes the outbox; events not yet acked stay in it for
// the next Publisher. It never hangs (it returns within CloseTimeout plus at
// most one NATS dial timeout), and later calls return the first result.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		close(p.closing)
		t := time.NewTimer(p.opts.CloseTimeout)
		select {
		case <-p.done:
		case <-t.C:
			p.cancel()
			<-p.done
		}
		t.Stop()
		p.cancel()
		p.js.CleanupPublisher()
		p.nc.RemoveStatusListener(p.status) // ends watch
		if n := p.Depth(); n > 0 {
			p.log.Warn().Int("depth", n).Msg("closing with events in the outbox; they are sent at the next start")
		}
		p.closeErr = p.ob.close()
	})
	return p.closeErr
}

// watch keeps the connected flag and wakes the sender on every connection
// status change, also while the sender waits for acks; it returns when Close
// removes the status listener.
func (p *Publisher) watch() {
	for st := range p.status {
		p.connected.Store(st == nats.CONNECTED)
		select {
		case p.statusWake <- struct{}{}:
		default:
		}
	}
}
