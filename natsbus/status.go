package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Node status: each agent's latest status is one message per node in a
// stream that keeps one message per subject, so a viewer reads the whole
// fleet's present (one message per node) without replaying history. It is
// a last value, not an action: a lost put is replaced by the next one, so
// it does not go through the outbox.
const (
	// StatusPrefix is the first tokens of every status subject: gcagent.v1.status.<cluster>.<node>.
	StatusPrefix = "gcagent.v1.status"
	// DefaultStatusStream is the stream of last values.
	DefaultStatusStream = "GCAGENT_STATUS"
	// DefaultStatusMaxAge forgets a node that has not reported for this long.
	DefaultStatusMaxAge = 7 * 24 * time.Hour
	// DefaultStatusMaxBytes bounds the stream: about 1 KiB per node, so
	// 64 MiB holds 60,000 nodes with room for a bigger payload.
	DefaultStatusMaxBytes = 64 << 20
	// statusMaxMsgSize refuses a status far larger than a heartbeat.
	statusMaxMsgSize = 64 << 10
	// statusDescription marks a status stream gcagent created.
	statusDescription = "gcagent node status, one last value per node"
)

// StatusSubject returns gcagent.v1.status.<cluster>.<node>, each token made safe by SafeToken.
func StatusSubject(cluster, node string) string {
	return StatusPrefix + "." + SafeToken(cluster) + "." + SafeToken(node)
}

// StatusOptions configures a StatusWriter; zero fields take the defaults.
type StatusOptions struct {
	// Cluster and Node name the subject. Node is required; Cluster defaults to "default".
	Cluster, Node string
	// Stream is the stream of last values. Default GCAGENT_STATUS.
	Stream string
	// Domain is the JetStream domain of the stream (a hub reached through a leaf node). Default: the local one.
	Domain string
	// NoCreateStream means the stream is managed elsewhere. Default false.
	NoCreateStream bool
	// Replicas of a created stream. Default 1.
	Replicas int
	// MaxAge of a created stream: a node silent for longer is forgotten. Default 7 days.
	MaxAge time.Duration
	// MaxBytes of a created stream. Default 64 MiB.
	MaxBytes int64
	// Timeout bounds one put (and the stream check before the first). Default 5s.
	Timeout time.Duration
	// Logger receives the writer's logs (component=natsbus is added). Default: no logs.
	Logger zerolog.Logger
}

func (o *StatusOptions) setDefaults() {
	o.Cluster = cmpOr(o.Cluster, DefaultCluster)
	o.Stream = cmpOr(o.Stream, DefaultStatusStream)
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.MaxAge == 0 {
		o.MaxAge = DefaultStatusMaxAge
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultStatusMaxBytes
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultAckTimeout
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ValidDomain reports whether d can be a JetStream domain: empty (the
// local one) or one subject token without slashes.
func ValidDomain(d string) bool {
	return d == "" || (SafeToken(d) == d && !strings.ContainsAny(d, "/\\"))
}

// NewJetStream returns a JetStream context for domain ("" is the local
// one): its API calls go to $JS.<domain>.API, which a leaf node forwards to
// the hub that runs that domain.
func NewJetStream(nc *nats.Conn, domain string, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	if !ValidDomain(domain) {
		return nil, fmt.Errorf("natsbus: invalid JetStream domain %q", domain)
	}
	if domain == "" {
		return jetstream.New(nc, opts...)
	}
	return jetstream.NewWithDomain(nc, domain, opts...)
}

// StatusWriter puts a node's status as the last value of its subject. It
// is safe for concurrent use.
type StatusWriter struct {
	js      jetstream.JetStream
	opts    StatusOptions
	subject string
	log     zerolog.Logger

	mu      sync.Mutex
	ensured bool
}

// NewStatusWriter returns a writer on nc (owned by the caller); it does no
// I/O. It fails on invalid options.
func NewStatusWriter(nc *nats.Conn, o StatusOptions) (*StatusWriter, error) {
	o.setDefaults()
	switch {
	case o.Node == "":
		return nil, errors.New("natsbus: node name is required")
	case SafeToken(o.Stream) != o.Stream || strings.ContainsAny(o.Stream, "/\\"):
		return nil, fmt.Errorf("natsbus: invalid status stream name %q", o.Stream)
	case o.Replicas < 1 || o.Replicas > 5:
		return nil, fmt.Errorf("natsbus: status stream replicas %d: must be within 1..5", o.Replicas)
	case o.MaxAge < 0 || o.MaxBytes < 0 || o.Timeout < 0:
		return nil, errors.New("natsbus: status stream bounds and timeout must not be negative")
	}
	js, err := NewJetStream(nc, o.Domain)
	if err != nil {
		return nil, err
	}
	return &StatusWriter{js: js, opts: o, subject: StatusSubject(o.Cluster, o.Node),
		log: o.Logger.With().Str("component", "natsbus").Logger()}, nil
}

// StatusStreamConfig is the config of a status stream gcagent creates:
// one message per subject, so its size is the fleet's size.
func StatusStreamConfig(name string, replicas int, maxAge time.Duration, maxBytes int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: name, Description: statusDescription, Subjects: []string{StatusPrefix + ".>"},
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxMsgsPerSubject: 1, MaxAge: maxAge, MaxBytes: maxBytes, MaxMsgSize: statusMaxMsgSize,
		Replicas: replicas, AllowDirect: true,
	}
}

// Put marshals v and stores it as this node's last value, waiting at most
// Timeout for the ack. The first put (and the first after the stream went
// away) makes sure the stream exists, unless NoCreateStream. It fails when
// NATS or the stream does not answer; the caller puts again next time.
func (w *StatusWriter) Put(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("natsbus: marshal status: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	if err := w.ensure(ctx); err != nil {
		return err
	}
	m := nats.NewMsg(w.subject)
	m.Data = b
	m.Header.Set(HeaderContentType, "application/json")
	m.Header.Set(HeaderSchema, Schema)
	m.Header.Set(HeaderNode, w.opts.Node)
	_, err = w.js.PublishMsg(ctx, m, jetstream.WithExpectStream(w.opts.Stream))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		w.mu.Lock()
		w.ensured = false
		w.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("natsbus: put status on %s: %w", w.subject, err)
	}
	return nil
}

func (w *StatusWriter) ensure(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ensured || w.opts.NoCreateStream {
		return nil
	}
	want := StatusStreamConfig(w.opts.Stream, w.opts.Replicas, w.opts.MaxAge, w.opts.MaxBytes)
	_, err := w.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = w.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil
		} else if err == nil {
			w.log.Info().Str("stream", want.Name).Int64("max_bytes", want.MaxBytes).Float64("max_age_s", want.MaxAge.Seconds()).
				Int("replicas", want.Replicas).Msg("status stream created")
		}
	}
	if err != nil {
		return fmt.Errorf("natsbus: ensure status stream %s: %w", want.Name, err)
	}
	w.ensured = true
	return nil
}
