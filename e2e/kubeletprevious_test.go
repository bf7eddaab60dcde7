package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	corev1 "k8s.io/api/core/v1"
)

// previousFailure is one answer of the kubelet's
// /containerLogs/...?previous=true that was not the log, with the container
// its pod status named as lastState before and after the call.
type previousFailure struct {
	at            time.Time
	code          int
	body          string
	before, after string // lastState's container id, "" if none
	restarts      int32
}

// lastStateID is the container id (without the runtime prefix) the status
// names as the container's lastState, and its restart count.
func lastStateID(p *corev1.Pod, name string) (string, int32) {
	s, ok := testenv.ContainerStatus(p, name)
	if !ok || s.LastTerminationState.Terminated == nil {
		return "", 0
	}
	id := s.LastTerminationState.Terminated.ContainerID
	if _, rest, ok := strings.Cut(id, "://"); ok {
		id = rest
	}
	return id, s.RestartCount
}

// TestKubeletPreviousLogsSurviveTheAgent (issue 34, item 8): beside a real
// kubelet 1.37.2 (default syncFrequency, 1m) running a crash-looping static
// pod, with --prune-containers=all and one dead container per name, the
// kubelet's /containerLogs/<ns>/<pod>/<ctr>?previous=true (what `kubectl
// logs --previous` reads) never fails because of the agent: no answer
// that is not the attempt's log comes while the status names, as the
// pod's lastState, a container the agent removed. 7485972 removed attempt
// N-1 20-60 ms after attempt N died, while the status named N-1 until the
// kubelet's next sync of the pod: it failed from the first restart on.
// The test polls both every 200 ms through three restarts and 30 s more.
// It logs, without failing, the failures that are the kubelet's own: its
// container deletor removes N-1 about a second after N dies (it keeps one
// dead container per name) while its status names N-1 until the sync that
// starts N+1, after the crash-loop backoff.
func TestKubeletPreviousLogsSurviveTheAgent(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		c.Import(t, testenv.Runnable(gcImage))
		k := testenv.StartKubelet(t, c, testenv.KubeletOptions{})
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--prune-containers=all", "--maximum-dead-containers-per-container=1",
			"--kubelet-config", k.ConfigPath, "--log-dir", "/var/log/containers", "--nats-url", ns.ClientURL())
		waitSynced(t, a)

		const pod, ctr = "crash", "app"
		k.PutPod(t, testenv.StaticPod(pod, corev1.Container{Name: ctr, Image: gcImage,
			Command: []string{"sh", "-c", "echo attempt of $(hostname) at $(date +%s); sleep 1; exit 3"}}))

		// Poll until the fourth restart has been seen for a while (its
		// window, until the kubelet's next sync of the pod, included).
		var fails []previousFailure
		polls, ok := 0, 0
		var doneAt time.Time
		testenv.EventuallyEvery(t, 6*time.Minute, 200*time.Millisecond, func() string {
			p, found := k.Pod(t, "default", pod)
			if !found {
				return "the kubelet has no pod " + pod
			}
			before, restarts := lastStateID(p, ctr)
			if before == "" {
				return fmt.Sprintf("no lastState yet (restarts %d)", restarts)
			}
			code, body := k.ContainerLogs(t, "default", pod, ctr, true)
			polls++
			// The kubelet answers 200 before it reads the log: an error
			// after that ("unable to retrieve container logs for ...") is
			// the body. Each attempt's log says "attempt of".
			if code == http.StatusOK && strings.Contains(body, "attempt of ") {
				ok++
			} else {
				after := ""
				if p, found := k.Pod(t, "default", pod); found {
					after, _ = lastStateID(p, ctr)
				}
				fails = append(fails, previousFailure{at: time.Now(), code: code, body: strings.TrimSpace(body), before: before, after: after, restarts: restarts})
			}
			switch {
			case restarts < 3:
				return fmt.Sprintf("%d restarts, want 3", restarts)
			case doneAt.IsZero():
				doneAt = time.Now()
			}
			// And some of the window after the third restart.
			if time.Since(doneAt) < 30*time.Second {
				return "watching the third restart's window"
			}
			return ""
		})

		// Who removed what: the agent's removals are its events.
		removedByAgent := map[string]bool{}
		testenv.Eventually(t, 60*time.Second, func() string {
			evs, why := deliveredStream(t, a, nc)
			if why != "" {
				return why
			}
			for id := range subjectsOf(evs, "container.removed") {
				removedByAgent[id] = true
			}
			return ""
		})
		// One line per container the status named while the log failed.
		type span struct {
			n           int
			first, last time.Time
			restarts    int32
			body        string
		}
		spans := map[string]*span{}
		var order []string
		byAgent, byKubelet := 0, 0
		for _, f := range fails {
			if f.before != f.after {
				continue // the status moved during the call: not judged
			}
			sp := spans[f.before]
			if sp == nil {
				sp = &span{first: f.at, restarts: f.restarts, body: f.body}
				spans[f.before] = sp
				order = append(order, f.before)
			}
			sp.n++
			sp.last = f.at
			if removedByAgent[f.before] {
				byAgent++
			} else {
				byKubelet++
			}
		}
		for _, id := range order {
			sp := spans[id]
			who := "the kubelet"
			if removedByAgent[id] {
				who = "the agent"
			}
			msg := fmt.Sprintf("previous=true failed %d times over %s at restart %d: the status named %.12s as lastState, which %s removed: %.160s",
				sp.n, sp.last.Sub(sp.first).Round(time.Millisecond), sp.restarts, id, who, sp.body)
			if removedByAgent[id] {
				t.Error(msg)
			} else {
				t.Log(msg)
			}
		}
		t.Logf("containerd %s: %d polls of previous=true, %d answered the log, %d failed: %d for a lastState the agent removed, %d for one the kubelet removed; the agent removed %d containers",
			v, polls, ok, len(fails), byAgent, byKubelet, len(removedByAgent))
		if ok == 0 {
			t.Error("previous=true never answered the log: the test saw no window to judge")
		}
	})
}
