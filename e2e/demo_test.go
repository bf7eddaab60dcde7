//go:build demo

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestDemo is `make demo`: a private containerd on a small tmpfs, the agent,
// a scripted workload, and the agent's live view after every step. It is a
// show, not a test; it fails only if a component does not work.
func TestDemo(t *testing.T) {
	v := testenv.V23
	if vs := testenv.Versions(); len(vs) == 1 {
		v = vs[0]
	}
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "320m"})
	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state,
		"--image-gc-high-threshold=70", "--image-gc-low-threshold=50", "--minimum-image-ttl-duration=2s",
		"--minimum-container-ttl-duration=3s", "--uncollected-exit-grace=2s", "--pod-log-grace=3s", "--keep-image=example.test/keep:*")
	rt, _ := c.CRI(t)
	printed := 0
	show := func(step string) {
		time.Sleep(1500 * time.Millisecond) // let the agent react, so the view shows it
		fmt.Printf("\n\033[1m=== %s\033[0m\n", step)
		b, _ := os.ReadFile(a.LogFile)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		for _, l := range lines[min(printed, len(lines)):] {
			if strings.Contains(l, `"level":"debug"`) {
				continue
			}
			fmt.Println("  log:", l)
		}
		printed = len(lines)
		out, err := exec.Command(testenv.AgentBinary(t), "status", "--address", a.Addr).CombinedOutput()
		if err != nil {
			t.Fatalf("gcagent status: %v\n%s", err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			fmt.Println("  " + sc.Text())
		}
	}

	testenv.Eventually(t, 20*time.Second, func() string {
		if code, _ := a.Get("/readyz", nil); code != 200 {
			return "agent not ready"
		}
		return ""
	})
	show(fmt.Sprintf("agent ready on containerd %s (root on a 320 MiB tmpfs)", v))

	base := testenv.Layer{Seed: "demo-base", Size: 8 << 20}
	c.Import(t, testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/web:1", base, testenv.Layer{Seed: "web", Size: 4 << 20}),
		testenv.Runnable("example.test/job:1", base, testenv.Layer{Seed: "job", Size: 4 << 20}),
		testenv.Image{Name: "example.test/keep:1", Layers: []testenv.Layer{{Seed: "keep", Size: 16 << 20}}})
	show("imported pause, web, job and a keep-pattern image")

	pod := c.RunPod(t, rt, "web", "default", "6b1f0f0e-demo-web")
	c.RunPodContainer(t, rt, pod, "web", "example.test/web:1", "sleep", "600")
	job := c.RunNative(t, "nightly-job", "example.test/job:1", "sh", "-c", "exit 0")
	c.WaitExit(t, job)
	show("a CRI pod runs web; a native job ran and exited")

	for i := range 5 {
		c.Import(t, testenv.Image{Name: fmt.Sprintf("example.test/old-%d:1", i), Layers: []testenv.Layer{{Seed: fmt.Sprintf("old-%d", i), Size: 20 << 20}}})
	}
	show("imported 5 unused 20 MiB images: the disk crosses the 70% high threshold")
	time.Sleep(3 * time.Second)
	show("after the minimum image age")

	resp, err := httpGet(a.Addr + "/metrics")
	if err == nil {
		fmt.Println("\n\033[1m=== gcagent metrics\033[0m")
		for _, l := range strings.Split(resp, "\n") {
			if strings.HasPrefix(l, "gcagent_") {
				fmt.Println("  " + l)
			}
		}
	}
}

func httpGet(addr string) (string, error) {
	resp, err := http.Get("http://" + addr)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
