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
}

// StartEmbedded starts an in-process NATS server with JetStream stored under
// StateDir/nats and returns it once it accepts clients; its URL is
// s.ClientURL(). Stop it with s.Shutdown() followed by s.WaitForShutdown().
// It fails when the options are invalid, the address is taken or JetStream
// cannot start.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	if o.StateDir == "" {
		return nil, errors.New("natsbus: embedded NATS needs a state dir")
	}
	if o.Listen == "" {
		o.Listen = DefaultEmbeddedListen
	}
	if o.ServerName == "" {
		o.ServerName = "gcagent"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	host, portStr, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return nil, fmt.Errorf("natsbus: embedded NATS listen address %q: %w", o.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, fmt.Errorf("natsbus: embedded NATS listen address %q: bad port", o.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT // "0" means the default port to nats-server; we mean any
	}
	s, err := server.NewServer(&server.Options{
		ServerName: o.ServerName,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(o.StateDir, "nats"),
		NoSigs:     true,
	})
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
