package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/node"
)

// stateIDFile holds the state dir's id (stateID).
const stateIDFile = "agent-id.json"

// stateIDRecord is the state dir's id and the dir it was made in.
type stateIDRecord struct {
	ID    string `json:"id"`
	Dev   uint64 `json:"dev"`
	Inode uint64 `json:"inode"`
}

// stateID returns the id of state dir dir, made once and kept in it: the
// agent lock tells by it the last run of this very state dir (over, as the
// state dir's own lock is held) from another agent. It is made anew when
// the dir is not the one it was made in (a copy of a state dir would
// otherwise claim another live agent's lock as its own).
func stateID(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(dir, stateIDFile)
	var rec stateIDRecord
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &rec) == nil && rec.ID != "" &&
		rec.Dev == uint64(st.Dev) && rec.Inode == st.Ino {
		return rec.ID, nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	rec = stateIDRecord{ID: hex.EncodeToString(b[:]), Dev: uint64(st.Dev), Inode: st.Ino}
	data, _ := json.Marshal(rec)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return "", fmt.Errorf("state dir id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("state dir id: %w", err)
	}
	return rec.ID, nil
}

// holdContainerd takes containerd's agent lock for this agent (call it
// with the state dir locked): one agent per containerd, whatever its state
// dir. Another agent that holds it makes it fail with a *node.HeldError,
// before anything else starts. When containerd does not answer yet, the
// lock is taken in g as soon as it does (the agent serves meanwhile, and
// deletes nothing), and g fails if another agent holds it. The lock is
// renewed in g, which fails when another agent takes it over. taken is
// closed once it is held.
func holdContainerd(ctx context.Context, g *errgroup.Group, cfg Config, cl *client.Client, clk *clock.Clock,
	log zerolog.Logger) (lock *node.AgentLock, taken <-chan struct{}, err error) {
	id, err := stateID(cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	log = log.With().Str("component", "agentlock").Logger()
	lock = node.NewAgentLock(node.LockStore{Leases: cl.LeasesService(), Namespaces: cl.NamespaceService()}, node.ThisAgent(cfg.NodeName, cfg.StateDir, id, version.Version),
		node.LockOptions{Clock: clock.System(clk.Now), Log: log})
	held := make(chan struct{})
	refused := func(err error) error {
		return fmt.Errorf("containerd %s: %w", cfg.ContainerdAddress, err)
	}
	var h *node.HeldError
	switch err := lock.Acquire(ctx, cfg.TakeOver); {
	case errors.As(err, &h):
		return nil, nil, refused(err)
	case err == nil:
		close(held)
	case ctx.Err() != nil:
		return nil, nil, ctx.Err()
	default:
		log.Warn().Err(err).Msg("cannot check yet that no other agent runs on containerd: nothing is deleted until it can")
		g.Go(func() error {
			for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
				err := lock.Acquire(ctx, cfg.TakeOver)
				switch {
				case errors.As(err, &h):
					return refused(err)
				case err == nil:
					close(held)
					return nil
				}
			}
		})
	}
	g.Go(func() error {
		select {
		case <-held:
		case <-ctx.Done():
			return nil
		}
		if err := lock.Run(ctx); err != nil {
			return fmt.Errorf("containerd %s: %w", cfg.ContainerdAddress, err)
		}
		return nil
	})
	return lock, held, nil
}
