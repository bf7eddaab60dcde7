package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/nats-io/nats.go"
)

// killHook makes the agent SIGKILL itself right after its first delete of
// kind, before the delete's event is stored (cmd/gcagent/intents.go).
func killHook(kind string) []string { return []string{"GCAGENT_TEST_KILL_AFTER_DELETE=" + kind} }

// waitKilledAfterDelete waits for the agent to die by its hook and checks
// that the delete's event did not reach the stream before the kill.
func waitKilledAfterDelete(t *testing.T, a *testenv.Agent, nc *nats.Conn, kindAction, subject string) {
	t.Helper()
	if !a.Exited(60 * time.Second) {
		t.Fatalf("the agent did not kill itself after a %s delete:\n%s", kindAction, a.LogTail(30))
	}
	if n := subjectsOf(readStream(t, nc), kindAction)[subject]; n != 0 {
		t.Fatalf("%s %s stored %d times before the restart: the kill did not come between delete and event", kindAction, subject, n)
	}
}

// waitEvents waits until the agent's outbox is empty and the stream holds
// want events of kindAction for subject, then checks the whole stream
// against the contract (every id once) and that the count stays at want.
func waitEvents(t *testing.T, a *testenv.Agent, nc *nats.Conn, kindAction, subject string, want int) []storedEvent {
	t.Helper()
	var evs []storedEvent
	testenv.Eventually(t, 60*time.Second, func() string {
		var why string
		if evs, why = deliveredStream(t, a, nc); why != "" {
			return why
		}
		if n := subjectsOf(evs, kindAction)[subject]; n < want {
			return fmt.Sprintf("%d %s events for %s, want %d", n, kindAction, subject, want)
		}
		return ""
	})
	types := checkContract(t, evs)
	t.Logf("stream: %d events %v", len(evs), types)
	if n := subjectsOf(evs, kindAction)[subject]; n != want {
		t.Errorf("%d %s events for %s, want exactly %d", n, kindAction, subject, want)
	}
	return evs
}

func logHas(t *testing.T, a *testenv.Agent, msg string) bool {
	t.Helper()
	b, _ := os.ReadFile(a.LogFile)
	return strings.Contains(string(b), msg)
}

// TestIntentKillBetweenDeleteAndEvent: for a dead container and for an
// image deleted by max age, the agent is SIGKILLed right after the delete
// and before its event is stored (a test hook). After the restart the
// intent it recorded before the delete is resolved against containerd and
// the removal is in the stream exactly once. Killed after the intent but
// before the delete, the restarted agent drops the intent (the container is
// still there), deletes it and publishes one event. For the image, the same digest
// is imported again while the agent is down: the restarted agent still
// counts the first delete (the image it finds is newer than the intent) and
// deletes the new copy too; the two removals of one digest are two events
// with two ids, not one dropped as a duplicate.
func TestIntentKillBetweenDeleteAndEvent(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())

		t.Run("container", func(t *testing.T) {
			c.Import(t, testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 256 << 10}))
			state := filepath.Join(t.TempDir(), "state")
			flags := []string{"--nats-url", ns.ClientURL(), "--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100"}
			a := testenv.StartAgentEnv(t, c, state, killHook("container"), flags...)
			natsWaitSynced(t, a)
			runDead(t, c, "intent-kill-1")
			waitKilledAfterDelete(t, a, nc, "container.removed", "intent-kill-1")
			if !containerGone(t, c, "intent-kill-1") {
				t.Fatal("the agent died before deleting the container")
			}
			a2 := testenv.StartAgent(t, c, state, flags...)
			waitEvents(t, a2, nc, "container.removed", "intent-kill-1", 1)
			if !logHas(t, a2, "delete intent resolved: the object is gone") {
				t.Errorf("no intent resolution in the log:\n%s", a2.LogTail(30))
			}
			a2.Stop()
		})

		t.Run("container-killed-before-delete", func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			flags := []string{"--nats-url", ns.ClientURL(), "--maximum-dead-containers-per-container", "0", "--image-gc-high-threshold", "100"}
			a := testenv.StartAgentEnv(t, c, state, []string{"GCAGENT_TEST_KILL_AFTER_INTENT=container"}, flags...)
			natsWaitSynced(t, a)
			runDead(t, c, "intent-pre-1")
			waitKilledAfterDelete(t, a, nc, "container.removed", "intent-pre-1")
			if containerGone(t, c, "intent-pre-1") {
				t.Fatal("the container was deleted although the agent died right after the intent")
			}
			a2 := testenv.StartAgent(t, c, state, flags...)
			waitRemoved(t, c, "intent-pre-1")
			waitEvents(t, a2, nc, "container.removed", "intent-pre-1", 1)
			if !logHas(t, a2, "delete intent resolved: the object is still there, the intent is dropped") {
				t.Errorf("the intent was not dropped:\n%s", a2.LogTail(30))
			}
			a2.Stop()
		})

		t.Run("image", func(t *testing.T) {
			img := testenv.Runnable("example.test/old:1", testenv.Layer{Seed: "old-" + string(v), Size: 128 << 10})
			digest := c.Import(t, img)[0].Target.Digest.String()
			state := filepath.Join(t.TempDir(), "state")
			flags := []string{"--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "100",
				"--minimum-image-ttl-duration", "0s", "--image-maximum-gc-age", "1s", "--prune-containers", "off",
				"--keep-image", "example.test/job:*"} // the kill must come after deleting old:1, not the container subtest's image
			a := testenv.StartAgentEnv(t, c, state, killHook("image"), flags...)
			waitKilledAfterDelete(t, a, nc, "image.removed", digest)
			if !imageGone(t, c, "example.test/old:1") {
				t.Fatal("the agent died before deleting the image")
			}
			// Pulled again while the agent is down.
			c.Import(t, img)
			a2 := testenv.StartAgent(t, c, state, flags...)
			evs := waitEvents(t, a2, nc, "image.removed", digest, 2)
			ids := map[string]bool{}
			for _, ev := range evs {
				if ev.KindAction == "image.removed" && ev.Subject == digest {
					ids[ev.ID] = true
				}
			}
			if len(ids) != 2 {
				t.Errorf("the two removals of %s have %d distinct ids", digest, len(ids))
			}
			if !imageGone(t, c, "example.test/old:1") {
				t.Error("the re-imported image was not deleted")
			}
			a2.Stop()
		})
	})
}

// TestIntentKillBetweenLogRemovalAndEvent: the same for a dangling log
// symlink, checked on the file system. One containerd version suffices:
// the log cleaner does not depend on the daemon's version.
func TestIntentKillBetweenLogRemovalAndEvent(t *testing.T) {
	t.Parallel()
	v := testenv.Versions()[len(testenv.Versions())-1]
	c := testenv.StartContainerd(t, testenv.Options{Version: v})
	ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	nc := natsConn(t, ns.ClientURL())
	state := filepath.Join(t.TempDir(), "state")
	flags := []string{"--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "100", "--prune-containers", "off", "--pod-log-grace", "1s"}
	a := testenv.StartAgentEnv(t, c, state, killHook("log"), flags...)
	natsWaitSynced(t, a)
	link := danglingLog(t, c, "intentpod", "0123456789abcdef")
	waitKilledAfterDelete(t, a, nc, "log.removed", link)
	if exists(link) {
		t.Fatal("the agent died before removing the symlink")
	}
	a2 := testenv.StartAgent(t, c, state, flags...)
	waitEvents(t, a2, nc, "log.removed", link, 1)
	if !logHas(t, a2, "delete intent resolved: the object is gone") {
		t.Errorf("no intent resolution in the log:\n%s", a2.LogTail(30))
	}
}
