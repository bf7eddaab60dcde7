package natsbus

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Connection defaults; a zero field in ConnOptions takes these.
const (
	DefaultReconnectMin     = 250 * time.Millisecond
	DefaultReconnectMax     = 20 * time.Second
	DefaultReconnectBufSize = 64 << 10
	DefaultPingInterval     = 30 * time.Second
)

// ConnOptions configures Connect; zero fields take the defaults.
type ConnOptions struct {
	// URL is one NATS URL or a comma-separated list. Required.
	URL string
	// Cluster and Node name the connection "gcagent/<cluster>/<node>". Cluster defaults to "default".
	Cluster, Node string

	// CredsFile is a chained JWT + nkey seed credentials file. Default none.
	CredsFile string
	// NkeyFile is an nkey seed file. Default none.
	NkeyFile string
	// User and Password authenticate with a user name and password. Default none.
	User, Password string
	// Token authenticates with a token. Default none.
	Token string
	// TLSCA is a PEM file of the CAs that sign the server's certificate. Default: the system roots when the URL is tls://.
	TLSCA string
	// TLSCert and TLSKey are the client certificate and key for mutual TLS. Default none.
	TLSCert, TLSKey string

	// ReconnectMin is the first delay after every server failed; it doubles up to ReconnectMax, with jitter. Default 250ms.
	ReconnectMin time.Duration
	// ReconnectMax is the longest delay between reconnect rounds. Default 20s.
	ReconnectMax time.Duration
	// ReconnectBufSize bounds what core publishes buffer while reconnecting. Default 64 KiB.
	ReconnectBufSize int
	// PingInterval is how often the client pings the server to detect a dead connection. Default 30s.
	PingInterval time.Duration

	// InboxPrefix replaces _INBOX as the prefix of the connection's reply
	// subjects (JetStream acks, control request replies), so that a node's
	// credentials may subscribe to its own replies only. Default _INBOX.
	InboxPrefix string
	// InProcess, when set, connects to an in-process server instead of
	// dialing URL (which then only names it). Default none.
	InProcess nats.InProcessConnProvider

	// FailFast makes Connect fail when no server answers the first
	// connect, for tools that ask once (ctl, watch); once connected they
	// reconnect like the agent. Default false: the agent's connection
	// retries in the background from the start.
	FailFast bool

	// Logger receives connection events (component=natsbus is added). Default: no logs.
	Logger zerolog.Logger
}

// InboxPrefix returns the per-node reply prefix _INBOX.<cluster>.<node>
// (each made one safe token), for ConnOptions.InboxPrefix and for the
// subscribe permission of a node's NATS user.
func InboxPrefix(cluster, node string) string {
	if cluster == "" {
		cluster = DefaultCluster
	}
	return nats.InboxPrefix + SafeToken(cluster) + "." + SafeToken(node)
}

func (o *ConnOptions) setDefaults() {
	if o.Cluster == "" {
		o.Cluster = DefaultCluster
	}
	if o.ReconnectMin == 0 {
		o.ReconnectMin = DefaultReconnectMin
	}
	if o.ReconnectMax == 0 {
		o.ReconnectMax = max(DefaultReconnectMax, o.ReconnectMin)
	}
	if o.ReconnectBufSize == 0 {
		o.ReconnectBufSize = DefaultReconnectBufSize
	}
	if o.PingInterval == 0 {
		o.PingInterval = DefaultPingInterval
	}
}

// Validate reports the first invalid field of o, after defaults, as one clear
// error: a missing URL or node, conflicting or incomplete credentials, or an
// unreadable credentials, key or certificate file.
func (o ConnOptions) Validate() error {
	o.setDefaults()
	if o.URL == "" {
		return errors.New("natsbus: NATS URL is required")
	}
	if o.Node == "" {
		return errors.New("natsbus: node name is required")
	}
	n := 0
	for _, set := range []bool{o.CredsFile != "", o.NkeyFile != "", o.User != "" || o.Password != "", o.Token != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return errors.New("natsbus: use only one of creds file, nkey file, user/password and token")
	case o.Password != "" && o.User == "":
		return errors.New("natsbus: a NATS password needs a user")
	case (o.TLSCert == "") != (o.TLSKey == ""):
		return errors.New("natsbus: a NATS TLS client certificate and key go together")
	case o.ReconnectMin < 0 || o.ReconnectMax < o.ReconnectMin:
		return fmt.Errorf("natsbus: reconnect delays must satisfy 0 <= min (%s) <= max (%s)", o.ReconnectMin, o.ReconnectMax)
	case o.ReconnectBufSize < 0 || o.PingInterval < 0:
		return errors.New("natsbus: reconnect buffer size and ping interval must not be negative")
	case o.InboxPrefix != "" && (strings.ContainsAny(o.InboxPrefix, "*> \t") || strings.HasSuffix(o.InboxPrefix, ".") || strings.HasPrefix(o.InboxPrefix, ".")):
		return fmt.Errorf("natsbus: invalid inbox prefix %q", o.InboxPrefix)
	}
	for _, f := range []struct{ what, path string }{
		{"creds file", o.CredsFile}, {"nkey file", o.NkeyFile},
		{"TLS CA", o.TLSCA}, {"TLS certificate", o.TLSCert}, {"TLS key", o.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if fh, err := os.Open(f.path); err != nil {
			return fmt.Errorf("natsbus: NATS %s: %w", f.what, err)
		} else {
			_ = fh.Close()
		}
	}
	return nil
}

// Connect validates o and returns a connection that never gives up: it
// returns even when no server is reachable yet (unless o.FailFast), and
// reconnects forever with jittered backoff. It fails only on invalid
// options, unusable credentials or, with FailFast, no server answering.
func Connect(o ConnOptions) (*nats.Conn, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Logger.With().Str("component", "natsbus").Logger()
	var lastErr atomic.Value // string: the last connect error logged, so each is logged once
	lastErr.Store("")
	// where names the server in the log: the embedded one is reached in
	// process, never through the URL it listens on.
	where := func(nc *nats.Conn) string { return nc.ConnectedUrlRedacted() }
	if o.InProcess != nil {
		where = func(*nats.Conn) string { return "in-process" }
	}
	opts := []nats.Option{
		nats.Name("gcagent/" + o.Cluster + "/" + o.Node),
		nats.RetryOnFailedConnect(!o.FailFast),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay(o.ReconnectMin, o.ReconnectMax)),
		nats.ReconnectBufSize(o.ReconnectBufSize),
		nats.PingInterval(o.PingInterval),
		nats.MaxPingsOutstanding(2),
		nats.IgnoreAuthErrorAbort(),
		nats.ConnectHandler(func(nc *nats.Conn) {
			lastErr.Store("")
			log.Info().Str("url", where(nc)).Bool("embedded", o.InProcess != nil).Msg("connected to NATS")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			lastErr.Store("")
			log.Info().Str("url", where(nc)).Bool("embedded", o.InProcess != nil).Msg("reconnected to NATS")
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed on purpose (Close): nothing reconnects; ClosedHandler says so
			}
			log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && lastErr.Swap(err.Error()) != err.Error() {
				log.Warn().Err(err).Msg("cannot connect to NATS; retrying, events wait in the outbox")
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Info().Msg("NATS connection closed")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			ev := log.Error().Err(err)
			if s != nil {
				ev = ev.Str("subject", s.Subject)
			}
			ev.Msg("NATS error")
		}),
	}
	switch {
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	case o.NkeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsbus: NATS nkey file: %w", err)
		}
		opts = append(opts, opt)
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.InProcess != nil {
		opts = append(opts, nats.InProcessServer(o.InProcess))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsbus: connect: %w", err) // no URL: it may hold a password
	}
	return nc, nil
}

// reconnectDelay returns nats.go's delay callback: lo doubled per round of
// failed attempts up to hi, then a uniformly random value in [d/2, d] so a
// fleet that lost its server does not come back in step.
func reconnectDelay(lo, hi time.Duration) nats.ReconnectDelayHandler {
	return func(attempts int) time.Duration {
		d := hi
		if attempts < 32 && lo<<max(attempts-1, 0) < hi {
			d = lo << max(attempts-1, 0)
		}
		if d <= 1 {
			return d
		}
		return d/2 + rand.N(d/2+1)
	}
}
