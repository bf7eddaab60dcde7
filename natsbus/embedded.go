package natsbus

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// DefaultEmbeddedListen is where the embedded server listens by default: loopback only.
const DefaultEmbeddedListen = "127.0.0.1:4222"

// EmbeddedOptions configures StartEmbedded; zero fields take the defaults.
type EmbeddedOptions struct {
	// StateDir holds the JetStream store (StateDir/nats). Required.
	StateDir string
	// Listen is the client host:port; port -1 picks a free one. Default 127.0.0.1:4222.
	Listen string
	// ServerName names the server in its logs and monitoring. Default "gcagent".
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept clients. Default 10s.
	ReadyTimeout time.Duration
	// Logger receives the server's notices, warnings and errors (component=nats-server). Default: no logs.
	Logger zerolog.Logger
	// AuthNkey is the public nkey of the one user the server accepts; empty
	// accepts any client (only for tests). Default empty.
	AuthNkey string
	// MaxStore bounds JetStream's file store, so that events never fill the
	// disk the agent protects; 0 leaves nats-server's default (most of the disk). Default 0.
	MaxStore int64
}

func (o *EmbeddedOptions) setDefaults() {
	if o.Listen == "" {
		o.Listen = DefaultEmbeddedListen
	}
	if o.ServerName == "" {
		o.ServerName = "gcagent"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
}

// Validate reports the first invalid field of o, after defaults: a missing
// state dir, an unparsable listen address or a negative store bound.
func (o EmbeddedOptions) Validate() error {
	o.setDefaults()
	_, _, err := o.hostPort()
	return err
}

// hostPort checks o and returns the host and port to give nats-server.
func (o EmbeddedOptions) hostPort() (string, int, error) {
	if o.StateDir == "" {
		return "", 0, errors.New("natsbus: embedded NATS needs a state dir")
	}
	if o.MaxStore < 0 {
		return "", 0, fmt.Errorf("natsbus: embedded NATS max store %d: must not be negative", o.MaxStore)
	}
	host, portStr, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return "", 0, fmt.Errorf("natsbus: embedded NATS listen address %q: %w", o.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("natsbus: embedded NATS listen address %q: bad port", o.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT // "0" means the default port to nats-server; we mean any
	}
	return host, port, nil
}

// StartEmbedded starts an in-process NATS server with JetStream stored under
// StateDir/nats and returns it once it accepts clients; its URL is
// s.ClientURL(). Stop it with s.Shutdown() followed by s.WaitForShutdown().
// It fails when the options are invalid, the address is taken or JetStream
// cannot start.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	o.setDefaults()
	host, port, err := o.hostPort()
	if err != nil {
		return nil, err
	}
	so := &server.Options{
		ServerName:        o.ServerName,
		Host:              host,
		Port:              port,
		JetStream:         true,
		StoreDir:          filepath.Join(o.StateDir, "nats"),
		JetStreamMaxStore: o.MaxStore,
		NoSigs:            true,
	}
	if o.AuthNkey != "" {
		so.Nkeys = []*server.NkeyUser{{Nkey: o.AuthNkey}}
	}
	s, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsbus: embedded NATS: %w", err)
	}
	fatal := make(chan string, 1)
	s.SetLoggerV2(serverLogger{o.Logger.With().Str("component", "nats-server").Logger(), fatal}, false, false, false)
	go s.Start()
	deadline := time.Now().Add(o.ReadyTimeout)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		var why string
		select {
		case why = <-fatal:
		default:
			if time.Now().Before(deadline) {
				continue
			}
			why = "not ready within " + o.ReadyTimeout.String()
		}
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("natsbus: embedded NATS on %s with store %s: %s", o.Listen, filepath.Join(o.StateDir, "nats"), why)
	}
	return s, nil
}

// serverLogger routes nats-server logs to zerolog (debug and trace are
// dropped) and reports the first fatal error on fatal instead of exiting.
type serverLogger struct {
	log   zerolog.Logger
	fatal chan<- string
}

func (l serverLogger) Noticef(format string, v ...any) { l.log.Info().Msgf(format, v...) }
func (l serverLogger) Warnf(format string, v ...any)   { l.log.Warn().Msgf(format, v...) }
func (l serverLogger) Errorf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l serverLogger) Debugf(string, ...any)           {}
func (l serverLogger) Tracef(string, ...any)           {}

func (l serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error().Msg(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
