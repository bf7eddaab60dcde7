//go:build demo

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
)

// TestDemo is `make demo`: a private containerd on a small tmpfs, the agent
// binary as the default install runs it (its embedded NATS server),
// `gcagent watch` run as an operator would on the node, and a scripted
// workload: a dead container pruned, a dangling log link removed, image GC
// under disk pressure. After each step it waits for the result (not for a
// fixed time) and prints what the operator sees: the agent's log lines and
// the watch view. It ends with a summary from the events stream and the
// agent's metrics. It fails only if a component does not work.
func TestDemo(t *testing.T) {
	begin := time.Now()
	// The containerd Debian installs (1.6), so that the demo needs nothing
	// built first; GCAGENT_TEST_CONTAINERD=2.3 picks the other.
	v := testenv.V16
	if vs := testenv.Versions(); len(vs) == 1 {
		v = vs[0]
	}
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "320m"})
	rt, _ := c.CRI(t)

	c.Import(t, testenv.Pause(c.SandboxImage),
		testenv.Runnable("example.test/web:1", testenv.Layer{Seed: "web", Size: 4 << 20}),
		testenv.Runnable("example.test/job:1", testenv.Layer{Seed: "job", Size: 4 << 20}),
		testenv.Image{Name: "example.test/keep:1", Layers: []testenv.Layer{{Seed: "keep", Size: 16 << 20}}})
	base := usagePercent(t, c.Root)
	high, low := base+15, base+5
	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state,
		fmt.Sprintf("--image-gc-high-threshold=%d", high), fmt.Sprintf("--image-gc-low-threshold=%d", low),
		"--minimum-image-ttl-duration=2s", "--minimum-container-ttl-duration=2s", "--uncollected-exit-grace=2s",
		"--pod-log-grace=2s", "--keep-image=example.test/keep:*",
		"--heartbeat-interval=2s")

	// The operator runs watch once the agent is up (its embedded server
	// writes where it listens into the state dir).
	testenv.Eventually(t, 30*time.Second, func() string {
		if code, _ := a.Get("/readyz", nil); code != 200 {
			return "agent not ready"
		}
		return ""
	})
	watchOut := filepath.Join(t.TempDir(), "watch.out")
	wf, err := os.Create(watchOut)
	if err != nil {
		t.Fatal(err)
	}
	// No NATS flags: watch finds the agent's embedded server through its
	// state dir, as `gcagent watch` does on a node.
	watch := localTool(t, state, "watch", "--refresh", "300ms", "--tail", "12")
	watch.Stdout, watch.Stderr = wf, wf
	watch.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	wf.Close()
	t.Cleanup(func() { _ = watch.Process.Kill(); _ = watch.Wait() })

	printed := 0
	logLines := func() {
		b, _ := os.ReadFile(a.LogFile)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		for _, l := range lines[min(printed, len(lines)):] {
			var e map[string]any
			dec := json.NewDecoder(strings.NewReader(l))
			dec.UseNumber() // bytes as integers, not 6.187454e+06
			if dec.Decode(&e) != nil || e["level"] == "debug" {
				continue
			}
			comp, _ := e["component"].(string)
			fmt.Printf("  \033[2mlog: %s: %s %s\033[0m\n", cmpOr(comp, "agent"), e["message"], briefFields(e))
		}
		printed = len(lines)
	}
	lastFrame := func() string {
		b, _ := os.ReadFile(watchOut)
		s := string(b)
		i := strings.LastIndex(s, "gcagent fleet")
		if i < 0 {
			return ""
		}
		// The frame being written may be cut: take the last complete one.
		if j := strings.LastIndex(s[:i], "gcagent fleet"); j >= 0 && !strings.HasSuffix(s, "\n") {
			return s[j:i]
		}
		return s[i:]
	}
	step := func(title string, watchShows ...string) {
		testenv.Eventually(t, 30*time.Second, func() string {
			f := lastFrame()
			for _, w := range watchShows {
				if !strings.Contains(f, w) {
					b, _ := os.ReadFile(watchOut)
					return "gcagent watch does not show " + w + " yet; it printed:\n" + string(b[max(0, len(b)-2000):])
				}
			}
			return ""
		})
		fmt.Printf("\n\033[1m=== %s\033[0m  (+%s)\n", title, time.Since(begin).Round(100*time.Millisecond))
		logLines()
		sc := bufio.NewScanner(strings.NewReader(lastFrame()))
		for sc.Scan() {
			fmt.Println("  │ " + sc.Text())
		}
	}

	step(fmt.Sprintf("agent ready on containerd %s: root on a 320 MiB tmpfs at %d%%, image GC at %d%% down to %d%%", v, base, high, low), "agent.started")

	pod := c.RunPod(t, rt, "web", "default", "6b1f0f0e-demo-web")
	c.RunPodContainer(t, rt, pod, "web", "example.test/web:1", "sleep", "600")
	job := c.RunNative(t, "nightly-job", "example.test/job:1", "sh", "-c", "exit 0")
	c.WaitExit(t, job)
	testenv.Eventually(t, 30*time.Second, func() string {
		if !containerGone(t, c, "nightly-job") {
			return "nightly-job not pruned yet"
		}
		return ""
	})
	step("a CRI pod runs web; a plain containerd job exited; nobody collected it for 2s (--uncollected-exit-grace), then its 2s TTL passed: pruned", "container.removed", "nightly-job")

	link := danglingLog(t, c, "batch", "5e1f0a9b7c3d2e10")
	testenv.Eventually(t, 30*time.Second, func() string {
		if exists(link) {
			return "dangling link still there"
		}
		return ""
	})
	step("a kubelet log link whose log and container are gone was removed", "log.removed")

	for i := range 5 {
		c.Import(t, testenv.Image{Name: fmt.Sprintf("example.test/old-%d:1", i), Layers: []testenv.Layer{{Seed: fmt.Sprintf("old-%d", i), Size: 20 << 20}}})
	}
	// GC frees down to the low threshold with what it may delete; an image
	// younger than the minimum age waits, and below the high threshold no
	// new pass starts (the kubelet's rule).
	testenv.Eventually(t, 60*time.Second, func() string {
		if u := usagePercent(t, c.Root); u >= high {
			return fmt.Sprintf("usage %d%% still at or above the high threshold", u)
		}
		return ""
	})
	step(fmt.Sprintf("5 unused 20 MiB images pushed the disk over %d%%: image GC removed the least recently used (now %d%%)", high, usagePercent(t, c.Root)),
		"image.removed", "gc.completed")

	// Summary, from the events stream and the metrics.
	url, seed, err := natsbus.LocalClient(state)
	if err != nil || url == "" {
		t.Fatalf("the agent's embedded NATS server: %q %v", url, err)
	}
	opt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	evs := readStream(t, nc)
	text, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n\033[1m=== summary\033[0m  (demo took %s)\n", time.Since(begin).Round(100*time.Millisecond))
	var est, freed int64
	var ctrLat []float64
	for _, ev := range evs {
		var d struct {
			Digest     string   `json:"digest"`
			Names      []string `json:"names"`
			Bytes      int64    `json:"bytes"`
			FreedBytes int64    `json:"freedBytes"`
			Latency    float64  `json:"latencySeconds"`
			Reason     string   `json:"reason"`
			Kind       string   `json:"kind"`
			Name       string   `json:"name"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		switch ev.KindAction {
		case "image.removed":
			est, freed = est+d.Bytes, freed+d.FreedBytes
			fmt.Printf("  image removed      %-28s %s  estimated %s, measured %s (%s)\n", demoTags(d.Names), d.Digest[:19], demoBytes(d.Bytes), demoBytes(d.FreedBytes), d.Reason)
		case "container.removed":
			ctrLat = append(ctrLat, d.Latency)
			fmt.Printf("  container removed  %-28s %s, latency %.0f ms as the agent reports it (from its owner being done, here exit + --uncollected-exit-grace, plus the TTL)\n", ev.Subject, d.Reason, d.Latency*1000)
		case "log.removed":
			fmt.Printf("  log removed        %-28s %s (%s)\n", d.Name, d.Kind, d.Reason)
		}
	}
	sort.Float64s(ctrLat)
	fmt.Printf("  images: %s estimated (image sizes: compressed content), %s measured by statfs (content and unpacked snapshots; shared layers only once)\n", demoBytes(est), demoBytes(freed))
	mean := func(name string) string {
		n := metricSum(text, name+"_count")
		if n == 0 {
			return "none"
		}
		return fmt.Sprintf("%.1f ms mean over %.0f", metricSum(text, name+"_sum")/n*1000, n)
	}
	fmt.Printf("  latency: high threshold crossed → first image removed: %s\n", mean("gcagent_image_gc_reaction_duration_seconds"))
	fmt.Printf("           dead container owner done + TTL → removed: %s\n", mean("gcagent_container_gc_removal_duration_seconds"))
	fmt.Printf("           dangling link removable → removed: %s\n", mean("gcagent_logs_removal_duration_seconds"))
	fmt.Printf("  NATS: %d events in stream GCAGENT_EVT, each published once\n", len(evs))
	checkContract(t, evs)
}

// briefFields keeps the log fields an operator reads first.
func briefFields(e map[string]any) string {
	var out []string
	for _, k := range []string{"image", "container", "name", "reason", "size_bytes", "freed_bytes", "usage", "trigger", "latency_s"} {
		if v, ok := e[k]; ok {
			out = append(out, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.Join(out, " ")
}

func demoTags(names []string) string {
	var tags []string
	for _, n := range names {
		if !strings.HasPrefix(n, "sha256:") {
			tags = append(tags, n)
		}
	}
	return strings.Join(tags, ",")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func demoBytes(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
