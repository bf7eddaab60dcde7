package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestLogsHostPodLogDirElsewhere: the agent sees the pod log dir at
// another path than the one the kubelet's links name (issue 27: a
// DaemonSet mounting /var/log/pods elsewhere, k3s, RKE2, a custom
// podLogsDir). Here the agent's --pod-log-dir is a bind mount of the
// daemon's pod log dir, and its --log-dir holds links into a host path
// prefix the agent does not see. Without --host-pod-log-dir no link goes,
// the one of an exited container whose log exists included, and the agent
// says why: a /readyz line, gcagent_logs_links_unverifiable and one warning.
// With GCAGENT_HOST_POD_LOG_DIR set to that prefix, the really dangling
// link goes and the one whose log exists stays.
func TestLogsHostPodLogDirElsewhere(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		pod := c.RunPod(t, rt, "shipper", "default", "7a1b2c3d-hostdir")
		job := c.RunPodContainerAttempt(t, rt, pod, "job", 0, gcImage, "sh", "-c", "echo done")
		gone := c.RunPodContainerAttempt(t, rt, pod, "gone", 0, gcImage, "sh", "-c", "echo bye")
		waitCRIExited(t, c, rt, job)
		waitCRIExited(t, c, rt, gone)
		jobLog := filepath.Join(pod.LogDir, "job", "0.log")
		if _, err := os.Stat(jobLog); err != nil {
			t.Fatalf("the job's log: %v", err)
		}
		// The kubelet removed the gone container's log: its link really dangles.
		if err := os.Remove(filepath.Join(pod.LogDir, "gone", "0.log")); err != nil {
			t.Fatal(err)
		}

		// The agent's view: the pod log dir bind-mounted at another path,
		// links naming the host's path, which does not exist for the agent.
		base := t.TempDir()
		view, links := filepath.Join(base, "agent", "pods"), filepath.Join(base, "agent", "containers")
		host := filepath.Join(base, "host", "var", "log", "pods")
		for _, d := range []string{view, links} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		bindMount(t, c.PodLogDir, view)
		hostPath := func(ctr string) string {
			return filepath.Join(host, filepath.Base(pod.LogDir), ctr, "0.log")
		}
		jobLink := filepath.Join(links, fmt.Sprintf("shipper_default_job-%s.log", job))
		goneLink := filepath.Join(links, fmt.Sprintf("shipper_default_gone-%s.log", gone))
		mustSymlink(t, hostPath("job"), jobLink)
		mustSymlink(t, hostPath("gone"), goneLink)
		flags := []string{"--prune-containers=off", "--image-gc-high-threshold=100", "--log-dir", links, "--pod-log-dir", view}

		// Without the mapping: both kept, and said.
		started := time.Now()
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "unmapped"), flags...)
		waitSynced(t, a)
		var readyz string
		testenv.Eventually(t, 20*time.Second, func() string {
			code, body, err := a.GetText("/readyz")
			if err != nil || code != 200 || !strings.Contains(body, "logs: 2 log links kept unverified") {
				return fmt.Sprintf("/readyz %d %v:\n%s", code, err, body)
			}
			readyz = body
			return ""
		})
		t.Logf("unmapped agent, /readyz after %s:\n%s", time.Since(started).Round(time.Millisecond), readyz)
		if !strings.Contains(readyz, "--host-pod-log-dir") || !strings.HasPrefix(readyz, "ok\n") {
			t.Errorf("/readyz does not say what to set, or is not ok first:\n%s", readyz)
		}
		m := mustMetrics(t, a)
		if !containsLine(m, "gcagent_logs_links_unverifiable 2") || !containsLine(m, `gcagent_logs_skipped{kind="symlink",reason="target-unverifiable"} 2`) {
			t.Errorf("metrics lack the unverifiable links:\n%s", grepLines(m, "gcagent_logs_"))
		}
		if metricSum(m, "gcagent_logs_removed_total") != 0 { // its series exist from the start, at zero
			t.Errorf("the unmapped agent removed something:\n%s", grepLines(m, "gcagent_logs_removed_total"))
		}
		time.Sleep(time.Second) // passes go on (projection changes, fsnotify): still one warning
		logText, _ := os.ReadFile(a.LogFile)
		if n := strings.Count(string(logText), "their targets lie outside the pod log dir the agent sees"); n != 1 {
			t.Errorf("%d warnings about unverifiable links, want 1:\n%s", n, grepLines(string(logText), "target-unverifiable"))
		}
		for _, l := range []string{jobLink, goneLink} {
			if _, err := os.Lstat(l); err != nil {
				t.Errorf("the unmapped agent removed %s: %v", l, err)
			}
		}
		a.Stop()

		// With the mapping, as a DaemonSet sets it: the dangling link goes.
		started = time.Now()
		a = testenv.StartAgentEnv(t, c, filepath.Join(t.TempDir(), "mapped"), []string{"GCAGENT_HOST_POD_LOG_DIR=" + host}, flags...)
		testenv.Eventually(t, 20*time.Second, func() string {
			if _, err := os.Lstat(goneLink); err == nil {
				return "the dangling link is still there"
			}
			return ""
		})
		t.Logf("mapped agent: dangling link removed %s after start", time.Since(started).Round(time.Millisecond))
		if _, err := os.Lstat(jobLink); err != nil {
			t.Errorf("the mapped agent removed the link of a container whose log exists: %v", err)
		}
		if _, err := os.Stat(jobLog); err != nil {
			t.Errorf("the job's log: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, func() string {
			m := mustMetrics(t, a)
			for _, want := range []string{"gcagent_logs_links_unverifiable 0",
				`gcagent_logs_removed_total{kind="symlink",reason="container-exited"} 1`,
				`gcagent_logs_skipped{kind="symlink",reason="target-exists"} 1`} {
				if !containsLine(m, want) {
					return "metrics lack " + want + ":\n" + grepLines(m, "gcagent_logs_")
				}
			}
			return ""
		})
		if code, body, err := a.GetText("/readyz"); err != nil || code != 200 || strings.Contains(body, "logs:") {
			t.Errorf("mapped agent /readyz %d %v:\n%s", code, err, body)
		}
	})
}

// grepLines returns the lines of text that contain sub.
func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
