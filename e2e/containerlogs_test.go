package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removedLogs is what the tests read of a container.removed (or, in a
// dry run, container.skipped) event's data.
type removedLogs struct {
	ID   string `json:"id"`
	Logs *struct {
		Path  string   `json:"path"`
		Files []string `json:"files"`
		Link  string   `json:"link"`
		Bytes int64    `json:"bytes"`
		Kept  string   `json:"kept"`
	} `json:"logs"`
}

// TestRemovedCRIContainerTakesItsLogs (issue 34, item 5): with
// --prune-containers=all, removing a pod container's older attempts
// through CRI also removes what the kubelet's removal removes: each
// attempt's log file, its rotated files beside it and its legacy link in
// the log link dir, as its container.removed event says. The kept
// attempt's log and link, and another pod's logs, stay. `gcagent plan`
// and a dry run name those files and remove nothing. 7485972 left every
// file and link of the removed attempts on disk.
func TestRemovedCRIContainerTakesItsLogs(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))

		web := c.RunPod(t, rt, "web", "default", "34a5-web")
		var jobs []string
		for i := range uint32(3) {
			id := c.RunPodContainerAttempt(t, rt, web, "job", i, gcImage, "sh", "-c", fmt.Sprintf("echo attempt %d; exit 1", i))
			waitCRIExited(t, c, rt, id)
			jobs = append(jobs, id)
		}
		other := c.RunPod(t, rt, "other", "default", "34a5-other")
		lone := c.RunPodContainerAttempt(t, rt, other, "job", 0, gcImage, "sh", "-c", "echo other; exit 1")
		waitCRIExited(t, c, rt, lone)
		// Each attempt's files, as the kubelet leaves them: its log, and
		// for the older ones the files its log rotation made.
		files := map[string][]string{} // container id -> its log files
		links := map[string]string{}   // container id -> its legacy link
		for i, id := range append(slices.Clone(jobs), lone) {
			p, name := web, "job"
			if id == lone {
				p, i = other, 0
			}
			log := filepath.Join(p.LogDir, name, fmt.Sprintf("%d.log", i))
			files[id] = []string{log}
			if id != lone {
				for _, rot := range []string{log + ".20260101-000000.gz", log + ".20260102-000000"} {
					if err := os.WriteFile(rot, []byte("rotated\n"), 0o644); err != nil {
						t.Fatal(err)
					}
					files[id] = append(files[id], rot)
				}
			}
			links[id] = filepath.Join(c.LogDir, fmt.Sprintf("%s_%s_%s-%s.log", p.Name, p.Namespace, name, id))
			testenv.Eventually(t, 20*time.Second, func() string {
				for _, f := range append(slices.Clone(files[id]), links[id]) {
					if _, err := os.Stat(f); err != nil {
						return err.Error()
					}
				}
				return ""
			})
		}
		flags := []string{"--prune-containers=all", "--maximum-dead-containers-per-container=1", "--kubelet-status-lag=1s",
			"--log-dir", c.LogDir, "--pod-log-dir", c.PodLogDir}
		there := func(what string, ids ...string) {
			t.Helper()
			for _, id := range ids {
				for _, f := range append(slices.Clone(files[id]), links[id]) {
					if _, err := os.Lstat(f); err != nil {
						t.Errorf("%s: %s: %v", what, f, err)
					}
				}
			}
		}

		// The plan names the files; nothing goes. (The previous attempt
		// is planned once the last one has been dead for the status lag.)
		planned := map[string]removedLogs{}
		testenv.Eventually(t, 30*time.Second, func() string {
			var plan struct {
				Containers struct {
					Remove []struct {
						ID   string          `json:"id"`
						Logs json.RawMessage `json:"logs"`
					} `json:"remove"`
				} `json:"containers"`
			}
			runPlan(t, c, &plan, flags...)
			clear(planned)
			for _, it := range plan.Containers.Remove {
				r := removedLogs{ID: it.ID}
				if len(it.Logs) > 0 {
					if err := json.Unmarshal(it.Logs, &r.Logs); err != nil {
						t.Fatal(err)
					}
				}
				planned[it.ID] = r
			}
			for _, id := range jobs[:2] {
				if _, ok := planned[id]; !ok {
					return "gcagent plan does not remove " + id
				}
			}
			return ""
		})
		for _, id := range jobs[:2] {
			checkLogs(t, "gcagent plan", planned[id], files[id], links[id])
		}
		there("after gcagent plan", jobs...)

		// A dry run says the same, and removes nothing.
		dryNATS := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		dry := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), append(flags, "--dry-run", "--nats-url", dryNATS.ClientURL())...)
		dryConn := natsConn(t, dryNATS.ClientURL())
		var skips []storedEvent
		testenv.Eventually(t, 60*time.Second, func() string {
			var why string
			if skips, why = deliveredStream(t, dry, dryConn); why != "" {
				return why
			}
			for _, id := range jobs[:2] {
				if subjectsOf(skips, "container.skipped")[id] == 0 {
					return "no container.skipped for " + id
				}
			}
			return ""
		})
		for _, id := range jobs[:2] {
			checkLogs(t, "dry run", eventLogs(t, skips, "container.skipped", id), files[id], links[id])
		}
		dry.Stop()
		there("after a dry run", jobs...)

		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), append(flags, "--nats-url", ns.ClientURL())...)
		testenv.Eventually(t, 60*time.Second, func() string {
			view := listCRIView(t, c, rt)
			for _, id := range jobs[:2] {
				if _, ok := view.criContainers[id]; ok {
					return "attempt " + id + " still listed"
				}
			}
			return view.agree()
		})
		for _, id := range jobs[:2] {
			evs := waitEvents(t, a, nc, "container.removed", id, 1)
			// The link went once, with its container: never also as a
			// dangling link of the log cleaner's.
			if n := subjectsOf(evs, "log.removed")[links[id]]; n != 0 {
				t.Errorf("the link of %s reported removed again, %d log.removed", id, n)
			}
			checkLogs(t, "removal", eventLogs(t, evs, "container.removed", id), files[id], links[id])
			for _, f := range append(slices.Clone(files[id]), links[id]) {
				if _, err := os.Lstat(f); !os.IsNotExist(err) {
					t.Errorf("%s of removed attempt %s: %v, want gone", f, id, err)
				}
			}
		}
		there("the kept attempt and another pod", jobs[2], lone)
		if _, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: jobs[2]}); err != nil {
			t.Errorf("the newest attempt: %v", err)
		}
	})
}

// eventLogs decodes the event of kindAction for subject id in evs.
func eventLogs(t *testing.T, evs []storedEvent, kindAction, id string) removedLogs {
	t.Helper()
	for _, ev := range evs {
		if ev.KindAction == kindAction && ev.Subject == id {
			var r removedLogs
			if err := json.Unmarshal(ev.Data, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("no %s event for %s", kindAction, id)
	return removedLogs{}
}

// checkLogs asserts that r names exactly files and link.
func checkLogs(t *testing.T, what string, r removedLogs, files []string, link string) {
	t.Helper()
	if r.Logs == nil {
		t.Errorf("%s of %s names no logs", what, r.ID)
		return
	}
	got := slices.Sorted(slices.Values(r.Logs.Files))
	want := slices.Sorted(slices.Values(files))
	if !slices.Equal(got, want) || r.Logs.Link != link || r.Logs.Bytes <= 0 || r.Logs.Kept != "" ||
		!strings.HasSuffix(r.Logs.Path, strings.TrimPrefix(files[0], filepath.Dir(filepath.Dir(filepath.Dir(files[0]))))) {
		t.Errorf("%s of %s: logs %+v\nwant files %q, link %s", what, r.ID, *r.Logs, want, link)
	}
}
