package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/gcagent/gcagent/internal/testenv"
)

// TestContainerGCOlderAttemptsGoWithTheDefaultLag (issue 40, item 3):
// with --prune-containers=all, one dead container per name and the
// default --kubelet-status-lag (2m), a pod container with four attempts
// that exit at once keeps its newest and, as the kubelet's pod status may
// still name it as lastState, the one before; the two older attempts go
// within seconds (10 s after the attempt after their successor started,
// KubeletStatusSettle, or after its exit when its start was not seen),
// not after the lag. Two pods: one whose attempts ran before the agent
// started (a restart, a first install: the listing shows no start), and
// one the agent watched. On d7dd547 the first pod's older attempts stayed
// for the lag. The order in which containerd delivered each watched
// attempt's start and exit is logged.
func TestContainerGCOlderAttemptsGoWithTheDefaultLag(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		var mu sync.Mutex
		order := map[string][]string{}
		followEvents(t, c, func(_ *cdevents.Envelope, ev any) {
			mu.Lock()
			defer mu.Unlock()
			switch e := ev.(type) {
			case *apievents.TaskStart:
				order[e.ContainerID] = append(order[e.ContainerID], "start")
			case *apievents.TaskExit:
				if e.ID == "" || e.ID == e.ContainerID {
					order[e.ContainerID] = append(order[e.ContainerID], "exit")
				}
			}
		}, nil)
		crashLoop := func(name, uid string) []string {
			p := c.RunPod(t, rt, name, "default", uid)
			var jobs []string
			for i := range uint32(4) {
				id := c.RunPodContainerAttempt(t, rt, p, "job", i, gcImage, "sh", "-c", fmt.Sprintf("exit %d", i+1))
				waitCRIExited(t, c, rt, id)
				jobs = append(jobs, id)
			}
			return jobs
		}
		// What stays of the jobs: their newest two attempts, once the
		// older ones went (at most 30 s: KubeletStatusSettle, 10 s, after
		// the newest attempt started, plus a pass, well within the lag).
		settle := func(what string, jobs []string) time.Duration {
			t.Helper()
			from := time.Now()
			testenv.Eventually(t, 30*time.Second, func() string {
				view := listCRIView(t, c, rt)
				var left []string
				for _, id := range jobs {
					if _, ok := view.criContainers[id]; ok {
						left = append(left, id)
					}
				}
				if !slices.Equal(left, jobs[2:]) {
					return fmt.Sprintf("%s: CRI holds %v, want the newest two attempts %v", what, left, jobs[2:])
				}
				return view.agree()
			})
			return time.Since(from)
		}

		before := crashLoop("before", "5e1d2c3b-before")
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--prune-containers=all", "--maximum-dead-containers-per-container=1")
		waitSynced(t, a)
		tookBefore := settle("attempts made before the agent started", before)

		watched := crashLoop("watched", "5e1d2c3b-watched")
		lastExit := time.Now()
		tookWatched := settle("attempts the agent watched", watched)
		// The previous attempt is the status's lastState: it stays for the
		// lag after the newest one died.
		if gone := time.Since(lastExit); gone < time.Minute {
			view := listCRIView(t, c, rt)
			for _, jobs := range [][]string{before, watched} {
				if _, ok := view.criContainers[jobs[2]]; !ok {
					t.Errorf("attempt 2 (the newest attempt's predecessor) removed within the lag")
				}
			}
		}
		mu.Lock()
		var seen []string
		for i, id := range watched {
			seen = append(seen, fmt.Sprintf("attempt %d: %s", i, strings.Join(order[id], ",")))
		}
		mu.Unlock()
		t.Logf("containerd %s: older attempts gone %s after the agent synced (made before it), %s after the last exit (watched); watched events as delivered: %s",
			v, tookBefore.Round(time.Millisecond), tookWatched.Round(time.Millisecond), strings.Join(seen, "; "))
	})
}
