package logs

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
)

// heldAtBegin is containerd's agent lock held when a removal's
// transaction begins and ended right before the removal (a slow settle
// or fsync, a frozen process).
type heldAtBegin struct{ ended error }

func (l heldAtBegin) Held() error { return nil }

func (l heldAtBegin) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	return ctx, func() {}, l.ended
}

// TestRemovalChecksTheLockRightBefore: a dangling link whose removal
// began while the agent held containerd's agent lock is not removed when
// the hold ended before the unlink: its intent is dropped, nothing is
// published, and the pass says why.
func TestRemovalChecksTheLockRightBefore(t *testing.T) {
	cfg, st := txDirs(t)
	writeFile(t, filepath.Join(cfg.PodLogDir, "ns_q_uid2", "app", "0.log"), "live pod\n")
	st.setPod("uid2", fakePod{alive: true})
	link := filepath.Join(cfg.LogDir, "p_ns_app-"+cid("e")+".log")
	symlink(t, filepath.Join(cfg.PodLogDir, "ns_q_uid2", "app", "gone.log"), link)
	bus := &fakeBus{}
	ended := errors.New("this agent does not hold containerd's agent lock now: not renewed for 20s")
	deletes, err := deletion.New(deletion.Deps{Journal: bus, Checker: &lstatChecker{}, Lock: heldAtBegin{ended}},
		deletion.Options{RetryGap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Deps{State: st, Deletes: deletes, Publisher: bus}, Options{Config: cfg, Clock: clock.System(func() time.Time { return t0 })})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clean(context.Background()); !errors.Is(err, ended) {
		t.Errorf("pass error %v, want the lock's", err)
	}
	if !exists(link) || len(bus.all()) != 0 {
		t.Fatalf("link gone %v, published %+v: want the link kept and nothing published", !exists(link), bus.all())
	}
	if got, want := bus.journal(), []string{"intend " + link, "abandon " + link}; !slices.Equal(got, want) {
		t.Errorf("journal %q, want %q", got, want)
	}
}
