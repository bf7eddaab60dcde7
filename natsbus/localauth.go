package natsbus

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// Files the agent writes into its state dir for the embedded server's local
// clients (gcagent watch and ctl on the same node): the user nkey seed the
// server accepts, and the URL the server listens on. Both are 0600 in a 0700
// dir, so only root (the agent's user) can read them.
const (
	LocalNkeyFile = "embedded-nats.nk"
	LocalURLFile  = "embedded-nats.url"
)

// EnsureLocalNkey returns the path and public key of the state dir's local
// user nkey, creating the seed (0600) when it is missing or unreadable as a
// user seed. The same seed is kept across restarts so that a running
// `gcagent watch` reconnects after the agent restarts.
func EnsureLocalNkey(stateDir string) (seedFile, public string, err error) {
	seedFile = filepath.Join(stateDir, LocalNkeyFile)
	if b, err := os.ReadFile(seedFile); err == nil {
		if kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b)))); err == nil {
			if pub, err := kp.PublicKey(); err == nil && nkeys.IsValidPublicUserKey(pub) {
				return seedFile, pub, os.Chmod(seedFile, 0o600)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("natsbus: local NATS credentials: %w", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", "", fmt.Errorf("natsbus: local NATS credentials: %w", err)
	}
	seed, _ := kp.Seed()
	public, _ = kp.PublicKey()
	if err := writePrivate(seedFile, append(seed, '\n')); err != nil {
		return "", "", fmt.Errorf("natsbus: local NATS credentials: %w", err)
	}
	return seedFile, public, nil
}

// WriteLocalURL records where the embedded server listens, for local clients.
func WriteLocalURL(stateDir, url string) error {
	return writePrivate(filepath.Join(stateDir, LocalURLFile), []byte(url+"\n"))
}

// RemoveLocalURL removes the recorded URL (none is no error): the agent
// does so before its listener binds, so that a URL left by an earlier run
// never sends a local tool to whatever holds the address now.
func RemoveLocalURL(stateDir string) error {
	err := os.Remove(filepath.Join(stateDir, LocalURLFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// LocalClient returns what a local tool needs to reach the embedded server of
// the agent whose state dir is stateDir: its URL ("" when not recorded) and
// its nkey seed file ("" when the agent has none). It fails only when the
// files exist but cannot be read (for example, not running as root).
func LocalClient(stateDir string) (url, nkeyFile string, err error) {
	seed := filepath.Join(stateDir, LocalNkeyFile)
	switch _, err := os.Stat(seed); {
	case err == nil:
		f, err := os.Open(seed)
		if err != nil {
			return "", "", fmt.Errorf("natsbus: local NATS credentials: %w", err)
		}
		_ = f.Close()
		nkeyFile = seed
	case errors.Is(err, fs.ErrNotExist):
	default:
		return "", "", fmt.Errorf("natsbus: local NATS credentials: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(stateDir, LocalURLFile))
	switch {
	case err == nil:
		url = strings.TrimSpace(string(b))
	case !errors.Is(err, fs.ErrNotExist):
		return "", "", fmt.Errorf("natsbus: local NATS URL: %w", err)
	}
	return url, nkeyFile, nil
}

// writePrivate replaces path with data, mode 0600, through a rename so that
// a reader never sees half a file.
func writePrivate(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
