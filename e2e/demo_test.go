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
	// The view is `gcagent watch --once` as the operator runs it on the
	// node (no NATS flags: watch finds the agent's embedded server through
	// its state dir), taken once it shows the step's outcome, so that it is
	// never an older frame.
	view := func(shows func(frame string) string) string {
		var frame string
		testenv.Eventually(t, 30*time.Second, func() string {
			out, err := localTool(t, state, "watch", "--once", "--since", "1h", "--tail", "12").Output()
			if frame = string(out); err != nil {
				return fmt.Sprintf("gcagent watch --once: %v\n%s", err, frame)
			}
			if why := shows(frame); why != "" {
				return "gcagent watch does not show " + why + " yet; it printed:\n" + frame
			}
			return ""
		})
		return frame
	}
	contains := func(want ...string) func(string) string {
		return func(frame string) string {
			for _, w := range want {
				if !strings.Contains(frame, w) {
					return w
				}
			}
			return ""
		}
	}
	step := func(title string, shows func(string) string) {
		frame := view(shows)
		fmt.Printf("\n\033[1m=== %s\033[0m  (+%s)\n", title, time.Since(begin).Round(100*time.Millisecond))
		logLines()
		sc := bufio.NewScanner(strings.NewReader(frame))
		for sc.Scan() {
			fmt.Println("  │ " + sc.Text())
		}
	}

	step(fmt.Sprintf("agent ready on containerd %s: root on a 320 MiB tmpfs at %d%%, image GC at %d%% down to %d%%", v, base, high, low), contains("agent.started"))

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
	step("a CRI pod runs web; a plain containerd job exited; nobody collected it for 2s (--uncollected-exit-grace), then its 2s TTL passed: pruned", contains("container.removed", "nightly-job"))

	link := danglingLog(t, c, "batch", "5e1f0a9b7c3d2e10")
	testenv.Eventually(t, 30*time.Second, func() string {
		if exists(link) {
			return "dangling link still there"
		}
		return ""
	})
	step("a kubelet log link whose log and container are gone was removed", contains("log.removed"))

	before, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.Import(t, testenv.Image{Name: fmt.Sprintf("example.test/old-%d:1", i), Layers: []testenv.Layer{{Seed: fmt.Sprintf("old-%d", i), Size: 20 << 20}}})
	}
	// GC frees down to the low threshold with what it may delete; an image
	// younger than the minimum age waits, within the episode, and below the
	// high threshold no new pass starts (the kubelet's rule). The step
	// waits for the episode to end, then says where it stopped and why.
	var st struct {
		ImageGC *struct {
			Episode  time.Time `json:"episode"`
			LastPass *struct {
				LowReached bool   `json:"lowReached"`
				UsageAfter int    `json:"usageAfter"` // measured after its last delete
				Shortfall  string `json:"shortfall"`
			} `json:"lastPass"`
		} `json:"imageGC"`
	}
	testenv.Eventually(t, 60*time.Second, func() string {
		if u := usagePercent(t, c.Root); u >= high {
			return fmt.Sprintf("usage %d%% still at or above the high threshold", u)
		}
		st.ImageGC = nil // a field /status omits must not keep the last value
		if code, err := a.Get("/status", &st); code != 200 || err != nil || st.ImageGC == nil || st.ImageGC.LastPass == nil {
			return fmt.Sprintf("no image GC pass in /status (%d, %v)", code, err)
		}
		if !st.ImageGC.Episode.IsZero() {
			return "the GC episode goes on (an image waits for its minimum age)"
		}
		return ""
	})
	why := fmt.Sprintf("down to the low threshold %d%%", low)
	if lp := st.ImageGC.LastPass; !lp.LowReached {
		why = fmt.Sprintf("and stopped above the low threshold %d%%: %s; below the high threshold no new pass starts (the kubelet's rule)",
			low, cmpOr(lp.Shortfall, "nothing more it may delete"))
	}
	text, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	removed := int(metricSum(text, "gcagent_image_gc_images_removed_total")) // every image removal, for watch's count
	now := removed - int(metricSum(before, "gcagent_image_gc_images_removed_total"))
	step(fmt.Sprintf("5 unused 20 MiB images pushed the disk over %d%%: image GC removed %d, the least recently used, %s (now %d%%)",
		high, now, why, st.ImageGC.LastPass.UsageAfter),
		func(frame string) string {
			// The node's row as it is now: its usage and every removal.
			for _, w := range []string{"image.removed", "gc.completed", fmt.Sprintf(" %d%% ", usagePercent(t, c.Root)), fmt.Sprintf(" %d/", removed)} {
				if !strings.Contains(frame, w) {
					return strings.TrimSpace(w)
				}
			}
			return ""
		})

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
	if text, err = metricsText(a); err != nil {
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
