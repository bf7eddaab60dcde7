package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// TestKubeletStaticPods: the real kubelet v1.37.2, standalone on the
// private containerd, runs a static pod (running and ready in its /pods,
// its CRI container labelled by the kubelet, its log linked in
// /var/log/containers) and restarts a crash-looping one: /pods shows its
// restarts and the last attempt's exit, and /containerLogs?previous=true
// answers with the output of the attempt lastState names, which counted
// itself in an emptyDir. Its configuration rewritten, the kubelet
// restarted reads it (/configz) and keeps the pod running. When the test
// is over, /var/log/containers and /var/lib/kubelet are as they were
// (StartKubelet checks) and the pods' cgroups are gone.
func TestKubeletStaticPods(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		var k *testenv.Kubelet
		cgroupsGoneAfter(t, func() *testenv.Kubelet { return k })
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		c.Import(t, testenv.Runnable(gcImage))
		k = testenv.StartKubelet(t, c, testenv.KubeletOptions{})
		rt, _ := c.CRI(t)

		k.PutPod(t, testenv.StaticPod("web", corev1.Container{Name: "server", Image: gcImage, Command: []string{"sleep", "600"}}))
		crash := testenv.StaticPod("crash", corev1.Container{
			Name: "app", Image: gcImage,
			Command:      []string{"sh", "-c", `n=$(( $(cat /data/n 2>/dev/null || echo 0) + 1 )); echo $n > /data/n; echo "attempt $n"; exit 3`},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		})
		crash.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		k.PutPod(t, crash)

		web := k.WaitPod(t, "default", "web", 3*time.Minute, func(p *corev1.Pod) string {
			s, ok := testenv.ContainerStatus(p, "server")
			if !ok || s.State.Running == nil || !s.Ready {
				return fmt.Sprintf("server not running and ready: %+v", s.State)
			}
			return ""
		})
		s, _ := testenv.ContainerStatus(web, "server")
		id := strings.TrimPrefix(s.ContainerID, "containerd://")
		resp, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("CRI status of the kubelet's container %s: %v", s.ContainerID, err)
		}
		if got := resp.Status.Labels["io.kubernetes.pod.name"]; got != k.StaticPodName("web") || resp.Status.State != runtime.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("CRI container %s: pod label %q, state %v; want %q, running", id, got, resp.Status.State, k.StaticPodName("web"))
		}
		links, _ := filepath.Glob(fmt.Sprintf("/var/log/containers/%s_default_server-%s.log", k.StaticPodName("web"), id))
		if len(links) != 1 {
			t.Fatalf("no /var/log/containers link for %s", id)
		}
		if target, err := os.Readlink(links[0]); err != nil || !strings.HasPrefix(target, c.PodLogDir+"/") {
			t.Fatalf("%s -> %q (%v); want a file under %s", links[0], target, err, c.PodLogDir)
		}

		// Two restarts: the second came after a crash-loop back-off.
		k.WaitPod(t, "default", "crash", 3*time.Minute, func(p *corev1.Pod) string {
			s, ok := testenv.ContainerStatus(p, "app")
			if !ok || s.RestartCount < 2 || s.LastTerminationState.Terminated == nil {
				return fmt.Sprintf("app: %d restarts, last state %+v", s.RestartCount, s.LastTerminationState)
			}
			return ""
		})
		// The kubelet's previous logs are those of the container lastState
		// names; CRI says which attempt it was (the kubelet's restartCount
		// annotation, from 0), and it printed its number (from 1). A
		// restart between the reads moves lastState: then read again.
		testenv.Eventually(t, time.Minute, func() string {
			before, _ := k.Pod(t, "default", "crash")
			code, body := k.ContainerLogs(t, "default", "crash", "app", true)
			after, _ := k.Pod(t, "default", "crash")
			sb, _ := testenv.ContainerStatus(before, "app")
			sa, _ := testenv.ContainerStatus(after, "app")
			last := sb.LastTerminationState.Terminated
			if sa.LastTerminationState.Terminated == nil || last.ContainerID != sa.LastTerminationState.Terminated.ContainerID {
				return "lastState moved while reading"
			}
			if code != 200 {
				t.Fatalf("previous logs of crash/app: %d %s", code, body)
			}
			if last.ExitCode != 3 {
				t.Fatalf("lastState exit code %d, want 3", last.ExitCode)
			}
			prev := strings.TrimPrefix(last.ContainerID, "containerd://")
			resp, err := rt.ContainerStatus(c.Ctx(), &runtime.ContainerStatusRequest{ContainerId: prev})
			if status.Code(err) == codes.NotFound {
				// A newer attempt died and the kubelet's container GC
				// (one dead container per name) removed this one before
				// the pod's status caught up.
				return fmt.Sprintf("lastState's container %s is gone", prev)
			}
			if err != nil {
				t.Fatalf("CRI status of lastState's container %s: %v", prev, err)
			}
			n, err := strconv.Atoi(resp.Status.Annotations["io.kubernetes.container.restartCount"])
			if err != nil {
				t.Fatalf("container %s: restartCount annotation: %v", prev, err)
			}
			if want := fmt.Sprintf("attempt %d\n", n+1); body != want {
				t.Fatalf("previous logs of crash/app: %q, want %q (the output of %s, restart %d)", body, want, prev, n)
			}
			return ""
		})

		// Tests rewrite the kubelet's configuration and restart it: it
		// reads the new file (a new inode) and adopts the pods still
		// running.
		if got := k.Configz(t).ImageGCHighThresholdPercent; got == nil || *got != 85 {
			t.Fatalf("/configz imageGCHighThresholdPercent %v, want the default 85", got)
		}
		k.EditConfig(t, func(cfg *kubeletv1beta1.KubeletConfiguration) {
			off := int32(100)
			cfg.ImageGCHighThresholdPercent = &off
		})
		k.Restart()
		if got := k.Configz(t).ImageGCHighThresholdPercent; got == nil || *got != 100 {
			t.Fatalf("/configz imageGCHighThresholdPercent %v after the rewrite and restart, want 100", got)
		}
		k.WaitPod(t, "default", "web", 3*time.Minute, func(p *corev1.Pod) string {
			if now, _ := testenv.ContainerStatus(p, "server"); now.ContainerID != s.ContainerID || now.State.Running == nil {
				return fmt.Sprintf("server %s %+v; want %s running on", now.ContainerID, now.State, s.ContainerID)
			}
			return ""
		})
	})
}

// cgroupsGoneAfter checks, after everything the test started has been
// cleaned up, that the kubelet's cgroups are gone. (StartKubelet's own
// cleanup checks /var/log/containers and /var/lib/kubelet while it still
// holds the machine's kubelet lock.)
func cgroupsGoneAfter(t *testing.T, kubelet func() *testenv.Kubelet) {
	t.Cleanup(func() {
		if k := kubelet(); k != nil {
			if left, _ := filepath.Glob("/sys/fs/cgroup/*" + k.CgroupRoot); len(left) > 0 {
				t.Errorf("the kubelet's cgroups are left: %v", left)
			}
		}
	})
}
