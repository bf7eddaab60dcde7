package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/rs/zerolog"
)

// killAfterDeleteEnv is a test hook, not a setting: when it names a kind
// (image, container, log), the agent sends itself SIGKILL right after its
// first delete of that kind, before the delete's event is stored, so that
// end-to-end tests can show the intent turning into exactly one event
// after the restart.
const killAfterDeleteEnv = "GCAGENT_TEST_KILL_AFTER_DELETE"

// killAfterIntentEnv is the same test hook one step earlier: SIGKILL right
// after the intent is recorded, before the delete.
const killAfterIntentEnv = "GCAGENT_TEST_KILL_AFTER_INTENT"

// natsPublisher adapts the outbox publisher to gc's publisher interfaces.
// Intend records an intent in the outbox; the next Publish of the same
// kind, action and subject completes it (the event gets the intent's key),
// Abandon drops it. It is safe for concurrent use.
type natsPublisher struct {
	p               *natsbus.Publisher
	killAfter       string // killAfterDeleteEnv
	killAfterIntent string // killAfterIntentEnv

	mu      sync.Mutex
	pending map[string][]natsbus.Intent // by intentKey, oldest first
}

var (
	_ gc.Publisher = (*natsPublisher)(nil)
	_ gc.Intender  = (*natsPublisher)(nil)
)

func newNATSPublisher(p *natsbus.Publisher) *natsPublisher {
	return &natsPublisher{p: p, pending: map[string][]natsbus.Intent{},
		killAfter: os.Getenv(killAfterDeleteEnv), killAfterIntent: os.Getenv(killAfterIntentEnv)}
}

func intentKey(kind, action, subject string) string { return kind + "\x00" + action + "\x00" + subject }

// Intend records a's intent before the delete.
func (n *natsPublisher) Intend(a gc.Action) error {
	in, err := n.p.Intend(natsbus.Action(a))
	if err != nil {
		return err
	}
	if n.killAfterIntent != "" && n.killAfterIntent == a.Kind {
		killSelf()
	}
	k := intentKey(a.Kind, a.Action, a.Subject)
	n.mu.Lock()
	n.pending[k] = append(n.pending[k], in)
	n.mu.Unlock()
	return nil
}

// take removes and returns the oldest pending intent for a.
func (n *natsPublisher) take(a gc.Action) (natsbus.Intent, bool) {
	k := intentKey(a.Kind, a.Action, a.Subject)
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.pending[k]
	if len(q) == 0 {
		return natsbus.Intent{}, false
	}
	if len(q) == 1 {
		delete(n.pending, k)
	} else {
		n.pending[k] = q[1:]
	}
	return q[0], true
}

// Abandon drops a's intent: the delete did not happen.
func (n *natsPublisher) Abandon(a gc.Action) error {
	in, ok := n.take(a)
	if !ok {
		return nil
	}
	return n.p.Abandon(in)
}

// Publish completes a's pending intent with a's data, or publishes a.
func (n *natsPublisher) Publish(a gc.Action) error {
	if n.killAfter != "" && n.killAfter == a.Kind && a.Action == "removed" {
		killSelf()
	}
	in, ok := n.take(a)
	if !ok {
		return n.p.Publish(natsbus.Action(a))
	}
	return n.p.Complete(in, a.Data)
}

// killSelf is kill -9 of this process, for the test hooks.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught: the process ends here
}

// IntendRemoval records a log removal's intent (logs.RemovalIntender).
func (p logsPublisher) IntendRemoval(_ context.Context, r logs.Removal) error {
	in, ok := p.pub.(gc.Intender)
	if !ok {
		return nil
	}
	return in.Intend(logAction(r))
}

// AbandonRemoval drops a log removal's intent.
func (p logsPublisher) AbandonRemoval(_ context.Context, r logs.Removal) error {
	in, ok := p.pub.(gc.Intender)
	if !ok {
		return nil
	}
	return in.Abandon(logAction(r))
}

// logAction is the log.removed action of r; with an intent its key is made
// unique by the outbox, so it needs no time.
func logAction(r logs.Removal) gc.Action {
	path := filepath.Join(r.Dir, r.Name)
	return gc.Action{Kind: "log", Action: "removed", Subject: path, Key: string(r.Kind) + ":" + path,
		Data: logRemoval{Removal: r, Namespace: events.CRINamespace}}
}

// logRemoval is the data of log.removed: kubelet logs are of pods in CRI's
// namespace.
type logRemoval struct {
	logs.Removal
	Namespace string `json:"namespace"`
}

// objectChecker tells whether the object of a pending intent is gone.
type objectChecker interface {
	// gone reports whether the object the intent was about to delete no
	// longer exists as it did then (deleted, or deleted and re-created after the intent).
	gone(ctx context.Context, in natsbus.Intent) (bool, error)
}

// nodeObjects checks images and containers in containerd and logs on the file system.
type nodeObjects struct{ cl *client.Client }

func (o nodeObjects) gone(ctx context.Context, in natsbus.Intent) (bool, error) {
	ctx = namespaces.WithNamespace(ctx, intentNamespace(in))
	switch in.Kind {
	case "image":
		imgs, err := o.cl.ImageService().List(ctx, "target.digest=="+strconv.Quote(in.Subject))
		if err != nil {
			return false, err
		}
		for _, img := range imgs {
			if !img.CreatedAt.After(in.At) {
				return false, nil // a name older than the intent survived: not deleted
			}
		}
		return true, nil
	case "container":
		c, err := o.cl.ContainerService().Get(ctx, in.Subject)
		if errdefs.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return c.CreatedAt.After(in.At), nil
	case "log":
		_, err := os.Lstat(in.Subject)
		if errors.Is(err, fs.ErrNotExist) {
			return true, nil
		}
		return false, err
	}
	return false, fmt.Errorf("intent of unknown kind %q", in.Kind)
}

// intentNamespace is the containerd namespace of the object an intent is
// about, from its data; intents recorded before namespaces were managed
// (none said) are CRI's.
func intentNamespace(in natsbus.Intent) string {
	var d struct {
		Namespace string `json:"namespace"`
	}
	if json.Unmarshal(in.Data, &d) != nil || d.Namespace == "" {
		return events.CRINamespace
	}
	return d.Namespace
}

// resolveIntents resolves each intent a crash left pending: the object is
// gone, so the delete happened and its event is stored (under the intent's
// id: once however often this runs); or it is still there and the intent is
// dropped. It retries an intent it cannot check (containerd not answering)
// with backoff until ctx ends. GC must not delete before this returns: a new
// delete of the same object would make an old intent look done.
func resolveIntents(ctx context.Context, p *natsbus.Publisher, objs objectChecker, log zerolog.Logger) error {
	pending, err := p.Pending()
	if err != nil || len(pending) == 0 {
		return err
	}
	log = log.With().Str("component", "natsbus").Logger()
	log.Info().Int("intents", len(pending)).Msg("delete intents left by the last run: checking which deletes happened")
	for _, in := range pending {
		wait := 100 * time.Millisecond
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			gone, err := objs.gone(cctx, in)
			cancel()
			if err == nil {
				ev := log.Info().Str("kind", in.Kind).Str("subject", in.Subject).Time("intended_at", in.At)
				if gone {
					err = p.Complete(in, nil)
					ev.Msg("delete intent resolved: the object is gone, its event is published")
				} else {
					err = p.Abandon(in)
					ev.Msg("delete intent resolved: the object is still there, the intent is dropped")
				}
				if err != nil {
					return err
				}
				break
			}
			log.Warn().Err(err).Str("kind", in.Kind).Str("subject", in.Subject).Dur("retry_in", wait).Msg("cannot check a delete intent yet")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			wait = min(2*wait, 10*time.Second)
		}
	}
	return nil
}
