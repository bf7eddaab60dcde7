//go:build !noembeddednats

package natsbus

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// EmbeddedBuilt says whether this binary holds the embedded NATS server:
// built with -tags noembeddednats it does not, and needs a NATS of its own.
const EmbeddedBuilt = true

// startServer starts the server Embedded keeps: in process only
// (nats-server's DontListen), since Embedded owns the client listener.
func startServer(o EmbeddedOptions) (runningServer, error) {
	s, err := startEmbedded(o, false)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// StartEmbedded starts an in-process NATS server with JetStream stored under
// StateDir/nats and returns it once it accepts clients; its URL is
// s.ClientURL(). Stop it with s.Shutdown() followed by s.WaitForShutdown().
// It fails when the options are invalid, the address is taken or JetStream
// cannot start.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) { return startEmbedded(o, true) }

// startEmbedded is StartEmbedded; without listen the server never binds
// o.Listen (clients reach it through InProcessConn only), so that a taken
// address cannot stop it.
func startEmbedded(o EmbeddedOptions, listen bool) (*server.Server, error) {
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
		DontListen:        !listen,
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
		if !listen {
			return nil, fmt.Errorf("natsbus: embedded NATS with store %s: %s", filepath.Join(o.StateDir, "nats"), why)
		}
		return nil, fmt.Errorf("natsbus: embedded NATS on %s with store %s: %s", o.Listen, filepath.Join(o.StateDir, "nats"), why)
	}
	return s, nil
}

// serverLogger routes nats-server logs to zerolog and reports the first
// fatal error on fatal instead of exiting. Its notices (the start banner,
// 28 lines at every start) go to debug: the agent says in one line of its
// own that the server is up. Its debug and trace are dropped.
type serverLogger struct {
	log   zerolog.Logger
	fatal chan<- string
}

func (l serverLogger) Noticef(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
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
