package natsbus

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rs/zerolog"
)

// DefaultEmbeddedListen is where the embedded server listens by default: loopback only.
const DefaultEmbeddedListen = "127.0.0.1:4222"

// EmbeddedOptions configures the embedded server (RunEmbedded); zero fields take the defaults.
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
		port = -1 // nats-server's RANDOM_PORT: to it, 0 means its default port (4222); we mean any
	}
	return host, port, nil
}

// EmbeddedKeepStored reports whether the embedded server's store in
// stateDir holds the fleet keep list bucket (the stream KV_gcagent_keep,
// in any account): false when the store or the bucket was never made (or
// was removed), so that no list can exist there. It errs when it cannot
// tell (a directory it cannot read): the caller must then assume a list.
// The store only changes through the agent's own server.
func EmbeddedKeepStored(stateDir string) (bool, error) {
	accounts := filepath.Join(stateDir, "nats", "jetstream")
	entries, err := os.ReadDir(accounts)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("natsbus: embedded NATS store: %w", err)
	}
	for _, acc := range entries {
		if !acc.IsDir() {
			continue
		}
		_, err := os.Stat(filepath.Join(accounts, acc.Name(), "streams", "KV_"+KeepBucket))
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, fs.ErrNotExist):
			return false, fmt.Errorf("natsbus: embedded NATS store: %w", err)
		}
	}
	return false, nil
}

// EmbeddedKeepWritten is when the embedded server last wrote a value of
// the fleet keep list bucket in stateDir's store (the newest modification
// time of the message blocks of the stream KV_gcagent_keep, in any
// account: a put appends to one; a shutdown rewrites only the index);
// zero when there is none. A copy of the list saved before it may lack
// what the store holds.
func EmbeddedKeepWritten(stateDir string) (time.Time, error) {
	var newest time.Time
	accounts := filepath.Join(stateDir, "nats", "jetstream")
	entries, err := os.ReadDir(accounts)
	if errors.Is(err, fs.ErrNotExist) {
		return newest, nil
	}
	if err != nil {
		return newest, fmt.Errorf("natsbus: embedded NATS store: %w", err)
	}
	for _, acc := range entries {
		root := filepath.Join(accounts, acc.Name(), "streams", "KV_"+KeepBucket)
		err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() || filepath.Ext(d.Name()) != ".blk" {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if info.ModTime().After(newest) {
				newest = info.ModTime()
			}
			return nil
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("natsbus: embedded NATS store: %w", err)
		}
	}
	return newest, nil
}
