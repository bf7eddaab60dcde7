package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/testenv"
)

// clockTruth records, from containerd's own event stream (stamped by the
// host's real clock, which the test never steps), when each image was
// created and deleted and when each container exited and was deleted.
type clockTruth struct {
	mu                sync.Mutex
	imgCreated        map[string]time.Time
	imgDeleted        map[string]time.Time
	exited, ctrDelete map[string]time.Time
}

func recordClockTruth(t testing.TB, c *testenv.Containerd) *clockTruth {
	l := &clockTruth{imgCreated: map[string]time.Time{}, imgDeleted: map[string]time.Time{},
		exited: map[string]time.Time{}, ctrDelete: map[string]time.Time{}}
	followEvents(t, c, func(env *cdevents.Envelope, v any) {
		l.mu.Lock()
		defer l.mu.Unlock()
		switch e := v.(type) {
		case *apievents.ImageCreate:
			if _, ok := l.imgCreated[e.Name]; !ok {
				l.imgCreated[e.Name] = env.Timestamp
			}
		case *apievents.ImageDelete:
			l.imgDeleted[e.Name] = env.Timestamp
		case *apievents.TaskExit:
			if e.ID == "" || e.ID == e.ContainerID {
				l.exited[e.ContainerID] = e.ExitedAt.AsTime()
			}
		case *apievents.ContainerDelete:
			l.ctrDelete[e.ID] = env.Timestamp
		}
	}, nil)
	return l
}

// life returns when key was born (image created, container exited) and
// deleted, zero if not (yet) seen.
func (l *clockTruth) life(image bool, key string) (born, deleted time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if image {
		return l.imgCreated[key], l.imgDeleted[key]
	}
	return l.exited[key], l.ctrDelete[key]
}

// TestClockStep steps the host's wall clock, as the agent and containerd
// see it, by +1 h and then by -2 h (to an hour behind) while the agent
// runs, then by +2 h while it is down (kill -9, restart), under constant disk pressure (every unused image past its minimum
// age must go) and a container TTL. The step is emulated at the process
// level (the real clock is shared): the test-only offset shifts the wall
// clock the agent reads and every time stamp it reads from containerd.
// Images and dead containers born before, between and after the steps must
// each go no earlier than their real minimum age (measured by containerd's
// unstepped stamps) and not much later.
func TestClockStep(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testClockStep(t, v) })
	}
}

func testClockStep(t *testing.T, v testenv.Version) {
	const (
		imageAge = 25 * time.Second // --minimum-image-ttl-duration
		ttl      = 15 * time.Second // --minimum-container-ttl-duration
		grace    = time.Second      // --uncollected-exit-grace: a plain container's TTL counts after it
		late     = 20 * time.Second // how long after its age an object may go (disk sampling, a loaded machine)
	)
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "160m"})
	truth := recordClockTruth(t, c)
	layer := func(seed string) testenv.Layer { return testenv.Layer{Seed: seed, Size: imgMiB} }
	c.Import(t, testenv.Runnable("example.test/ctr:1", layer("ctr")))

	stateDir := t.TempDir()
	flags := []string{
		// Threshold 1%: always under pressure, so only the minimum age
		// keeps an unused image.
		"--image-gc-high-threshold=1", "--image-gc-low-threshold=0",
		"--minimum-image-ttl-duration=" + imageAge.String(), "--minimum-container-ttl-duration=" + ttl.String(),
		"--uncollected-exit-grace=" + grace.String(), "--prune-containers=native",
	}
	a := testenv.StartAgentEnv(t, c, stateDir, []string{clock.TestOffsetEnv + "=0s"}, flags...)
	waitSynced(t, a)

	// step writes the offset file and waits for the agent to log it.
	step := func(to time.Duration) {
		t.Helper()
		n := strings.Count(readLog(t, a), "test clock offset stepped")
		if err := os.WriteFile(filepath.Join(stateDir, clock.TestOffsetFile), []byte(to.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() string {
			if strings.Count(readLog(t, a), "test clock offset stepped") <= n {
				return "agent did not read the offset " + to.String()
			}
			return ""
		})
		t.Logf("wall clock stepped to %s", to)
	}
	var imgs, ctrs []string
	born := func(phase string) {
		t.Helper()
		name := "example.test/" + phase + ":1"
		c.Import(t, testenv.Runnable(name, layer(phase)))
		ctr := c.RunNative(t, "c-"+phase, "example.test/ctr:1", "true")
		c.WaitExit(t, ctr)
		imgs, ctrs = append(imgs, name), append(ctrs, "c-"+phase)
	}
	born("before")  // recorded before the steps: its age must not jump by +1 h
	step(time.Hour) // forward: containerd's new stamps are an hour ahead
	born("ahead")   // stamped +1 h: must not look an hour younger either
	step(-time.Hour)
	born("behind") // stamped -1 h: must not look an hour older

	// kill -9, step +2 h while the agent is down, start again: the ages
	// recorded so far must not jump by 2 h either. What is born while the
	// agent is down is found by the listing, whose containerd times are
	// now an hour ahead: it must not look an hour younger.
	a.Kill()
	if err := os.WriteFile(filepath.Join(stateDir, clock.TestOffsetFile), []byte("1h"), 0o600); err != nil {
		t.Fatal(err)
	}
	born("down")
	a = testenv.StartAgentEnv(t, c, stateDir, []string{clock.TestOffsetEnv + "=1h"}, flags...)
	waitSynced(t, a)
	if !strings.Contains(readLog(t, a), "the wall clock stepped while the agent was down") {
		t.Fatal("the restarted agent did not notice the step while it was down")
	}
	t.Logf("wall clock stepped to 1h while the agent was down")
	born("restarted") // stamped +1 h by containerd, after the restart

	type obj struct {
		image bool
		key   string
		age   time.Duration
	}
	var all []obj
	for _, n := range imgs {
		all = append(all, obj{true, n, imageAge})
	}
	for _, id := range ctrs {
		all = append(all, obj{false, id, ttl + grace})
	}
	// Wait for every object to go, failing as soon as one goes early.
	testenv.Eventually(t, imageAge+late+10*time.Second, func() string {
		var waiting []string
		for _, o := range all {
			b, d := truth.life(o.image, o.key)
			if b.IsZero() || d.IsZero() { // the recorder may still be behind
				waiting = append(waiting, o.key)
				continue
			}
			if got := d.Sub(b); got < o.age {
				t.Fatalf("%s removed %s after its birth, before its minimum age %s", o.key, got.Round(time.Millisecond), o.age)
			}
		}
		if len(waiting) > 0 {
			return "not removed yet: " + strings.Join(waiting, ", ")
		}
		return ""
	})
	for _, o := range all {
		b, d := truth.life(o.image, o.key)
		got := d.Sub(b)
		t.Logf("%s: removed %s after its birth (minimum age %s)", o.key, got.Round(time.Millisecond), o.age)
		if got > o.age+late {
			t.Errorf("%s removed %s after its birth, more than %s after its minimum age %s", o.key, got, late, o.age)
		}
	}
}

// readLog returns the agent's log so far.
func readLog(t testing.TB, a *testenv.Agent) string {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
