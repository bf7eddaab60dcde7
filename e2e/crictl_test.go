package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/schema"
)

// crictl is a client operators run beside the agent: these tests drive a
// private containerd's CRI with the real crictl `make deps` builds
// (cri-tools v1.37.0) and read what it shows after the agent acted.

// flexInt reads a JSON number, or a number in a string (protojson's 64-bit
// integers).
type flexInt int64

func (n *flexInt) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	*n = flexInt(v)
	return err
}

type crictlImage struct {
	ID       string   `json:"id"`
	RepoTags []string `json:"repoTags"`
	Size     flexInt  `json:"size"`
	Pinned   bool     `json:"pinned"`
}

// crictlImages is `crictl images -o json`, by tag.
func crictlImages(t *testing.T, c *testenv.Containerd) map[string]crictlImage {
	t.Helper()
	var out struct {
		Images []crictlImage `json:"images"`
	}
	if err := json.Unmarshal([]byte(c.MustCrictl(t, "images", "-o", "json")), &out); err != nil {
		t.Fatalf("crictl images -o json: %v", err)
	}
	m := map[string]crictlImage{}
	for _, im := range out.Images {
		for _, tag := range im.RepoTags {
			m[tag] = im
		}
	}
	return m
}

type crictlContainer struct {
	ID           string `json:"id"`
	PodSandboxID string `json:"podSandboxId"`
	Metadata     struct {
		Name    string `json:"name"`
		Attempt int    `json:"attempt"`
	} `json:"metadata"`
	State string `json:"state"`
}

// crictlPs is `crictl ps -a -o json`, by id.
func crictlPs(t *testing.T, c *testenv.Containerd) map[string]crictlContainer {
	t.Helper()
	var out struct {
		Containers []crictlContainer `json:"containers"`
	}
	if err := json.Unmarshal([]byte(c.MustCrictl(t, "ps", "-a", "-o", "json")), &out); err != nil {
		t.Fatalf("crictl ps -a -o json: %v", err)
	}
	m := map[string]crictlContainer{}
	for _, ct := range out.Containers {
		m[ct.ID] = ct
	}
	return m
}

// crictlPods is `crictl pods -o json`: sandbox id -> state.
func crictlPods(t *testing.T, c *testenv.Containerd) map[string]string {
	t.Helper()
	var out struct {
		Items []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(c.MustCrictl(t, "pods", "-o", "json")), &out); err != nil {
		t.Fatalf("crictl pods -o json: %v", err)
	}
	m := map[string]string{}
	for _, p := range out.Items {
		m[p.ID] = p.State
	}
	return m
}

// crictlImageFS is `crictl imagefsinfo -o json`: the image filesystem's
// mount point and used bytes.
func crictlImageFS(t *testing.T, c *testenv.Containerd) (string, int64) {
	t.Helper()
	var out struct {
		Status struct {
			ImageFilesystems []struct {
				FsID struct {
					Mountpoint string `json:"mountpoint"`
				} `json:"fsId"`
				UsedBytes struct {
					Value flexInt `json:"value"`
				} `json:"usedBytes"`
			} `json:"imageFilesystems"`
		} `json:"status"`
	}
	raw := c.MustCrictl(t, "imagefsinfo", "-o", "json")
	if err := json.Unmarshal([]byte(raw), &out); err != nil || len(out.Status.ImageFilesystems) == 0 {
		t.Fatalf("crictl imagefsinfo -o json: %v\n%s", err, raw)
	}
	fs := out.Status.ImageFilesystems[0]
	return fs.FsID.Mountpoint, int64(fs.UsedBytes.Value)
}

// crictlPod writes the pod and container configs crictl reads (JSON, with
// the kubelet's labels, host network, the pod's log dir) and returns the
// pod config's path.
func crictlPod(t *testing.T, c *testenv.Containerd, name, uid string, attempt int) (string, string) {
	t.Helper()
	logDir := filepath.Join(c.PodLogDir, "default_"+name+"_"+uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": uid, "attempt": attempt},
		"log_directory": logDir,
		"labels": map[string]string{
			"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid,
		},
		"linux": map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}}, // NODE
	}
	return writeJSON(t, fmt.Sprintf("pod-%s-%d.json", name, attempt), cfg), logDir
}

// crictlRun runs a container in the pod with crictl create and start, as an
// operator does (no pull: the image is imported), and links its log as the
// kubelet would.
func crictlRun(t *testing.T, c *testenv.Containerd, podID, podCfg, pod, uid, name string, attempt int, image string, cmd ...string) string {
	t.Helper()
	ctrCfg := writeJSON(t, fmt.Sprintf("ctr-%s-%s-%d.json", pod, name, attempt), map[string]any{
		"metadata": map[string]any{"name": name, "attempt": attempt},
		"image":    map[string]any{"image": image},
		"command":  cmd,
		"log_path": fmt.Sprintf("%s/%d.log", name, attempt),
		"labels": map[string]string{
			"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid,
			"io.kubernetes.container.name": name,
		},
	})
	id := strings.TrimSpace(c.MustCrictl(t, "create", "--no-pull", podID, ctrCfg, podCfg))
	c.MustCrictl(t, "start", id)
	return id
}

func writeJSON(t *testing.T, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitCrictlExited waits until crictl shows the container exited.
func waitCrictlExited(t *testing.T, c *testenv.Containerd, id string) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() string {
		if st := crictlPs(t, c)[id].State; st != "CONTAINER_EXITED" {
			return fmt.Sprintf("%s is %q", id, st)
		}
		return ""
	})
}

// TestCrictlPodAndAgentGC: a pod started with crictl runp, create and start
// keeps its images, its running container, the newest run of a restarting
// container and its sandbox while the agent prunes (--prune-containers=all,
// one dead run per container) and deletes unused images by age; `crictl ps
// -a` no longer shows the older runs, `crictl images` no longer shows the
// unused images, and `crictl imagefsinfo` shows the bytes freed. A second
// pod stopped with crictl keeps its sandbox while its log dir is there
// (the pod is still known) and loses it, through CRI, once that is gone.
func TestCrictlPodAndAgentGC(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		testenv.CrictlPath(t)
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "256m"})
		const unusedSize = 8 << 20
		unused := []string{"example.test/old-a:1", "example.test/old-b:1", "example.test/old-c:1"}
		imgs := []testenv.Image{testenv.Pause(c.SandboxImage), testenv.Runnable("example.test/app:1"), testenv.Runnable("example.test/job:1")}
		for _, name := range unused {
			imgs = append(imgs, testenv.Runnable(name, testenv.Layer{Seed: name, Size: unusedSize}))
		}
		c.Import(t, imgs...)

		webCfg, _ := crictlPod(t, c, "web", "crictl-web-uid", 0)
		web := strings.TrimSpace(c.MustCrictl(t, "runp", webCfg))
		app := crictlRun(t, c, web, webCfg, "web", "crictl-web-uid", "app", 0, "example.test/app:1", "sleep", "600")
		batchCfg, batchLogs := crictlPod(t, c, "batch", "crictl-batch-uid", 0)
		batch := strings.TrimSpace(c.MustCrictl(t, "runp", batchCfg))
		once := crictlRun(t, c, batch, batchCfg, "batch", "crictl-batch-uid", "once", 0, "example.test/job:1", "true")
		waitCrictlExited(t, c, once)
		c.MustCrictl(t, "rm", once)
		c.MustCrictl(t, "stopp", batch)
		var jobs []string
		for i := range 3 {
			id := crictlRun(t, c, web, webCfg, "web", "crictl-web-uid", "job", i, "example.test/job:1", "sh", "-c", fmt.Sprintf("exit %d", i+1))
			waitCrictlExited(t, c, id)
			jobs = append(jobs, id)
		}
		before := crictlImages(t, c)
		for _, name := range append([]string{"example.test/app:1", "example.test/job:1", c.SandboxImage}, unused...) {
			if _, ok := before[name]; !ok {
				t.Fatalf("crictl images does not show %s before the agent: %v", name, before)
			}
		}
		// CRI's image filesystem usage is refreshed on its own period (10 s):
		// 0 until its first refresh.
		var mount string
		var usedBefore int64
		testenv.EventuallyEvery(t, 60*time.Second, time.Second, func() string {
			if mount, usedBefore = crictlImageFS(t, c); usedBefore < int64(len(unused))*unusedSize {
				return fmt.Sprintf("crictl imagefsinfo: used %d bytes, less than the unused images hold", usedBefore)
			}
			return ""
		})
		if !strings.HasPrefix(mount, c.Root+"/") {
			t.Errorf("crictl imagefsinfo mount point %s is not under the containerd root %s the agent measures", mount, c.Root)
		}

		// A pod whose log dir went counts as deleted after --pod-log-grace
		// (1m by default): 1s here, so that its sandbox goes within the wait.
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--prune-containers=all",
			"--maximum-dead-containers-per-container=1", "--image-gc-high-threshold=100",
			"--minimum-image-ttl-duration=0s", "--image-maximum-gc-age=3s", "--pod-log-grace=1s",
			"--kubelet-status-lag=1s") // no kubelet shows the previous attempts
		waitSynced(t, a)

		testenv.Eventually(t, 60*time.Second, func() string {
			ps := crictlPs(t, c)
			var have []string
			for id := range ps {
				have = append(have, id)
			}
			want := []string{app, jobs[2]}
			slices.Sort(have)
			slices.Sort(want)
			if !slices.Equal(have, want) {
				return fmt.Sprintf("crictl ps -a shows %v, want the running app and the newest job run %v", have, want)
			}
			imgs := crictlImages(t, c)
			for _, name := range unused {
				if _, ok := imgs[name]; ok {
					return "crictl images still shows " + name
				}
			}
			return ""
		})
		ps := crictlPs(t, c)
		if ps[app].State != "CONTAINER_RUNNING" || ps[jobs[2]].State != "CONTAINER_EXITED" {
			t.Errorf("app %s, newest job %s: want running, exited", ps[app].State, ps[jobs[2]].State)
		}
		after := crictlImages(t, c)
		for _, name := range []string{"example.test/app:1", "example.test/job:1", c.SandboxImage} {
			if _, ok := after[name]; !ok {
				t.Errorf("crictl images no longer shows %s, which the pods use", name)
			}
		}
		pods := crictlPods(t, c)
		if pods[web] != "SANDBOX_READY" {
			t.Errorf("web sandbox %s is %q, want ready", web, pods[web])
		}
		if pods[batch] != "SANDBOX_NOTREADY" {
			t.Errorf("batch sandbox %s is %q: the newest sandbox of a pod whose log dir is there must stay", batch, pods[batch])
		}
		var usedAfter int64
		testenv.EventuallyEvery(t, 60*time.Second, time.Second, func() string {
			_, usedAfter = crictlImageFS(t, c)
			if freed := usedBefore - usedAfter; freed < int64(len(unused))*unusedSize/2 {
				return fmt.Sprintf("crictl imagefsinfo: used %d bytes before, %d after: less than half of the %d bytes of the removed images",
					usedBefore, usedAfter, len(unused)*unusedSize)
			}
			return ""
		})
		t.Logf("containerd %s: crictl imagefsinfo used %d -> %d bytes (%d freed; the removed images hold %d)",
			v, usedBefore, usedAfter, usedBefore-usedAfter, len(unused)*unusedSize)

		// The kubelet removes a deleted pod's log dir: the sandbox goes.
		if err := os.RemoveAll(batchLogs); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, func() string {
			if st, ok := crictlPods(t, c)[batch]; ok {
				return fmt.Sprintf("crictl pods still shows the batch sandbox (%s) after its log dir went", st)
			}
			return ""
		})
		if st := crictlPods(t, c)[web]; st != "SANDBOX_READY" {
			t.Errorf("web sandbox is %q after the batch sandbox went", st)
		}
		m := mustMetrics(t, a)
		for _, want := range []string{
			`gcagent_container_gc_containers_removed_total{kind="container",namespace="k8s.io",reason="per-unit-cap"} 2`,
			`gcagent_container_gc_containers_removed_total{kind="sandbox",namespace="k8s.io",reason="pod-deleted"} 1`, // the kubelet's deleted-pod rule
			fmt.Sprintf(`gcagent_image_gc_images_removed_total{namespace="k8s.io",reason="max-age"} %d`, len(unused)),
		} {
			if !containsLine(m, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
	})
}

// TestCrictlRmiPruneRace: `crictl rmi --prune` runs the moment the agent
// starts deleting the same unused images by age. Both end well: crictl
// exits 0 with no error, every unused image is gone, and the agent reports
// no failure: each image is one it removed, one it skipped because someone
// else deleted it first (gone, or its names changed under it), or one it
// never had to plan; its log, its metrics and the events it published to
// NATS say the same.
func TestCrictlRmiPruneRace(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		testenv.CrictlPath(t)
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "256m"})
		const n = 40
		imgs := []testenv.Image{testenv.Pause(c.SandboxImage), testenv.Runnable("example.test/app:1")}
		var unused []string
		for i := range n {
			name := fmt.Sprintf("example.test/prune-%02d:1", i)
			unused = append(unused, name)
			imgs = append(imgs, testenv.Image{Name: name, Layers: []testenv.Layer{{Seed: name, Size: 64 << 10}}})
		}
		recs := c.Import(t, imgs...)
		digestOf := map[string]string{}
		for _, r := range recs {
			digestOf[r.Name] = r.Target.Digest.String()
		}
		podCfg, _ := crictlPod(t, c, "web", "crictl-race-uid", 0)
		pod := strings.TrimSpace(c.MustCrictl(t, "runp", podCfg))
		crictlRun(t, c, pod, podCfg, "web", "crictl-race-uid", "app", 0, "example.test/app:1", "sleep", "600")

		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--nats-url", ns.ClientURL(),
			"--prune-containers=off", "--image-gc-high-threshold=100",
			"--minimum-image-ttl-duration=0s", "--image-maximum-gc-age=2s")
		waitSynced(t, a)

		// The moment the agent's first delete is logged, crictl prunes.
		testenv.EventuallyEvery(t, 30*time.Second, 2*time.Millisecond, func() string {
			if !slices.Contains(agentMessages(t, a, "imagegc"), "image removed") {
				return "the agent removed no image:\n" + a.LogTail(20)
			}
			return ""
		})
		start := time.Now()
		prune := c.Crictl(t, 2*time.Minute, "rmi", "--prune")
		t.Logf("containerd %s: crictl rmi --prune took %s; exit %d; stderr %q",
			v, time.Since(start).Round(time.Millisecond), prune.Code, prune.Stderr)
		crictlDeleted := map[string]bool{}
		for _, l := range strings.Split(prune.Stdout, "\n") {
			if name, ok := strings.CutPrefix(strings.TrimSpace(l), "Deleted: "); ok {
				crictlDeleted[name] = true
			}
		}

		testenv.Eventually(t, 30*time.Second, func() string {
			imgs := crictlImages(t, c)
			for _, name := range unused {
				if _, ok := imgs[name]; ok {
					return "crictl images still shows " + name
				}
			}
			return ""
		})
		if _, ok := crictlImages(t, c)["example.test/app:1"]; !ok {
			t.Error("the running container's image is gone")
		}

		// What the agent says it did, in its stream: every image event
		// has a reason that is not a failure.
		var evs []storedEvent
		testenv.Eventually(t, 30*time.Second, func() string {
			var why string
			evs, why = deliveredStream(t, a, nc)
			return why
		})
		checkContract(t, evs)
		removed, removedNames, skipped := map[string]bool{}, map[string]bool{}, map[string]string{}
		for _, ev := range evs {
			switch ev.KindAction {
			case "image.removed", "image.skipped":
				var d schema.ImageEvent
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					t.Fatal(err)
				}
				if ev.KindAction == "image.removed" {
					removed[d.Digest] = true
					for _, name := range d.Names {
						removedNames[name] = true
					}
				} else {
					skipped[d.Digest] = string(d.Reason)
				}
			case "gc.failed":
				t.Errorf("the agent published gc.failed: %s", ev.Data)
			}
		}
		// crictl's prune ignores a failed delete ("there might be races")
		// but not an image gone between its listing and its status lookup:
		// that race is crictl's own, with any other deleter. It is accepted
		// only for images the agent removed, and the test says so.
		if prune.Code != 0 {
			for _, l := range strings.Split(strings.TrimSpace(prune.Stderr), "\n") {
				m := noSuchImage.FindStringSubmatch(l)
				if m == nil || !removedNames[m[1]] {
					t.Errorf("crictl rmi --prune: exit %d: %s", prune.Code, l)
				}
			}
			t.Logf("crictl rmi --prune exited %d: images the agent removed after crictl listed them (crictl's own race):\n%s", prune.Code, prune.Stderr)
		}
		ownerWon := 0
		for _, name := range unused {
			d := digestOf[name]
			switch r, isSkipped := skipped[d]; {
			case removed[d]:
			case isSkipped && (r == "gone" || r == "changed"):
				ownerWon++
			case isSkipped:
				t.Errorf("%s: the agent skipped it as %q, a failure", name, r)
			}
		}
		m := mustMetrics(t, a)
		if f := metricSum(m, `gcagent_image_gc_passes_total{result="failed"`); f != 0 {
			t.Errorf("%v image GC passes failed", f)
		}
		if e := metricSum(m, `gcagent_image_gc_images_skipped_total{reason="error"`); e != 0 {
			t.Errorf("%v images skipped for an error", e)
		}
		for _, l := range agentLevels(t, a) {
			t.Errorf("agent logged at %s", l)
		}
		deletedUnused := 0
		for _, name := range unused {
			if crictlDeleted[name] {
				deletedUnused++
			}
		}
		t.Logf("containerd %s: of %d unused images the agent removed %d and skipped %d as deleted by someone else; crictl deleted %d of them (and %d other images)",
			v, n, len(removed), ownerWon, deletedUnused, len(crictlDeleted)-deletedUnused)
		if ownerWon == 0 || deletedUnused == 0 {
			t.Errorf("no overlap (the agent skipped %d as gone, crictl deleted %d): the race did not happen", ownerWon, deletedUnused)
		}
	})
}

// noSuchImage is crictl's error for an image gone before its status lookup.
var noSuchImage = regexp.MustCompile(`no such image (sha256:[0-9a-f]{64})`)

// agentMessages are the messages the agent logged for component.
func agentMessages(t *testing.T, a *testenv.Agent, component string) []string {
	t.Helper()
	var out []string
	for _, l := range imgAgentLog(t, a, component) {
		out = append(out, l.Message)
	}
	return out
}

// agentLevels are the agent's log lines at warn or error level.
func agentLevels(t *testing.T, a *testenv.Agent) []string {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Level string `json:"level"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && (l.Level == "warn" || l.Level == "error") {
			out = append(out, l.Level+": "+sc.Text())
		}
	}
	return out
}
