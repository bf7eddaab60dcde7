package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestLogsEvidenceIsOfItsContainerd: review of issue 40, finding 1. The
// agent ran on the pods' containerd and saved that the pod log dir holds
// that containerd's pods (poddirs.json); it is then started, with the
// same state dir and log dirs, on another containerd that runs no pod (a
// --containerd-address changed to Docker's containerd on a k3s node). The
// saved verdict was the first containerd's: the dir of its live pod,
// quiet for an hour, stays however many graces pass, kept as
// pod-log-dir-unverified. Before the fix the saved verdict held for any
// containerd and the agent removed the dir (pod-unknown) at once.
func TestLogsEvidenceIsOfItsContainerd(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		kubelets := testenv.StartContainerd(t, testenv.Options{Version: v}) // the pods' containerd
		other := testenv.StartContainerd(t, testenv.Options{Version: v})    // the one the agent is moved to
		rt, _ := kubelets.CRI(t)
		kubelets.Import(t, testenv.Runnable(gcImage), testenv.Pause(kubelets.SandboxImage))
		other.Import(t, testenv.Pause(other.SandboxImage))
		quiet := kubelets.RunPod(t, rt, "quiet", "default", "7d8e9fa0-quiet")
		kubelets.RunPodContainer(t, rt, quiet, "server", gcImage, "sleep", "600")

		state := filepath.Join(t.TempDir(), "state")
		args := []string{"--log-dir", kubelets.LogDir, "--pod-log-dir", kubelets.PodLogDir, "--pod-log-grace=1s", "--prune-containers=off"}
		a := testenv.StartAgent(t, kubelets, state, args...)
		testenv.Eventually(t, 30*time.Second, func() string {
			st, err := agentLogs(t, a)
			if err != nil || st.Logs.PodLogDir.By != "cri" {
				return fmt.Sprintf("pod log dir not verified yet: %+v %v", st.Logs.PodLogDir, err)
			}
			return ""
		})
		a.Stop()
		ageTree(t, time.Hour, quiet.LogDir)

		start := time.Now()
		a = testenv.StartAgent(t, other, state, args...)
		waitSynced(t, a)
		tick := filepath.Join(kubelets.LogDir, "tick") // not a link: a change that asks for a pass
		testenv.Eventually(t, 30*time.Second, func() string {
			mustWrite(t, tick, time.Now().String())
			if _, err := os.Stat(quiet.LogDir); err != nil {
				t.Fatalf("the dir of the first containerd's live pod removed by the agent on another containerd: %v", err)
			}
			st, err := agentLogs(t, a)
			if err != nil {
				return err.Error()
			}
			if st.Logs.At.Before(start.Add(5 * time.Second)) {
				return "no pass five graces after the start yet"
			}
			for _, d := range st.Logs.Decisions {
				if d.Name == filepath.Base(quiet.LogDir) && d.Reason != "pod-log-dir-unverified" {
					return fmt.Sprintf("%s: %s %s, want pod-log-dir-unverified", d.Name, d.Action, d.Reason)
				}
			}
			return ""
		})
		if _, err := os.Stat(quiet.LogDir); err != nil {
			t.Errorf("pod dir %s: %v", quiet.LogDir, err)
		}
	})
}
