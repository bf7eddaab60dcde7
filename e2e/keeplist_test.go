package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go/jetstream"
)

// keepServer is a NATS server the fleet keep list is tested on: the Go
// module's (go.mod's nats-server) or Debian's nats-server 2.9.10 (the
// oldest supported), which can stop and start again on the same port and
// store.
type keepServer struct {
	kind  string
	url   string
	port  int
	store string
	stop  func()
}

// keepServerKinds are the servers every keep list test runs against.
var keepServerKinds = []string{"go-module", "debian-2.9.10"}

// startKeepServer starts a server of kind (on port and store when given,
// else on a free port and a new store).
func startKeepServer(t *testing.T, kind string, port int, store string) *keepServer {
	t.Helper()
	if store == "" {
		store = t.TempDir()
	}
	s := &keepServer{kind: kind, store: store}
	switch kind {
	case "go-module":
		if port == 0 {
			fmt.Sscanf(testenv.FreeAddr(t)[len("127.0.0.1:"):], "%d", &port)
		}
		ns := natsAt(t, port, store)
		s.url, s.port, s.stop = ns.ClientURL(), port, func() { stopNATS(ns) }
	case "debian-2.9.10":
		ns := testenv.StartDebianNATS(t, testenv.DebianNATSOptions{Port: port, StoreDir: store})
		if ns.Version != "2.9.10" {
			t.Logf("Debian's nats-server is %s here, not 2.9.10", ns.Version)
		}
		s.url, s.port, s.stop = ns.URL, ns.Port, ns.Stop
	default:
		t.Fatalf("server kind %q", kind)
	}
	return s
}

// forEachKeepServer runs fn on each containerd version against each
// server kind.
func forEachKeepServer(t *testing.T, fn func(t *testing.T, v testenv.Version, kind string)) {
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		for _, kind := range keepServerKinds {
			t.Run(kind, func(t *testing.T) { fn(t, v, kind) })
		}
	})
}

// importPinned imports img and leaves it with the names a digest-pinned
// pull gives: repo@<manifest digest> only (the tag it was imported under
// is deleted). It returns that name.
func importPinned(t *testing.T, c *testenv.Containerd, img testenv.Image) string {
	t.Helper()
	rec := c.Import(t, img)[0]
	repo := img.Name[:strings.LastIndexByte(img.Name, ':')]
	pinned := images.Image{Name: repo + "@" + rec.Target.Digest.String(), Target: rec.Target, Labels: rec.Labels}
	if _, err := c.Client.ImageService().Create(c.Ctx(), pinned); err != nil {
		t.Fatalf("create %s: %v", pinned.Name, err)
	}
	if err := c.Client.ImageService().Delete(c.Ctx(), img.Name); err != nil {
		t.Fatalf("delete %s: %v", img.Name, err)
	}
	return pinned.Name
}

// keptBy is why the agent's plan keeps the image named name ("reason
// rule"), or what went wrong.
func keptBy(a *testenv.Agent, name string) string {
	var p struct {
		Images struct {
			Delete, Keep []struct {
				Names  []string `json:"names"`
				Reason string   `json:"reason"`
				Rule   string   `json:"rule"`
			}
		} `json:"images"`
	}
	if code, err := a.Get("/plan", &p); err != nil || code != 200 {
		return fmt.Sprintf("plan: %d %v", code, err)
	}
	for _, k := range p.Images.Keep {
		for _, n := range k.Names {
			if n == name {
				return k.Reason + " " + k.Rule
			}
		}
	}
	for _, k := range p.Images.Delete {
		for _, n := range k.Names {
			if n == name {
				return "to delete: " + k.Reason
			}
		}
	}
	return name + " not in the plan"
}

// agentLogLines are the agent's JSON log lines.
func agentLogLines(t *testing.T, a *testenv.Agent) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// firstLogged is the time of the first line whose message starts with
// msg (and whose fields include want, if given); zero when none.
func firstLogged(t *testing.T, a *testenv.Agent, msg string, want map[string]string) time.Time {
	t.Helper()
	for _, l := range agentLogLines(t, a) {
		if !strings.HasPrefix(fmt.Sprint(l["message"]), msg) {
			continue
		}
		match := true
		for k, v := range want {
			if !strings.Contains(fmt.Sprint(l[k]), v) {
				match = false
			}
		}
		if !match {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
		if err != nil {
			t.Fatalf("log time %v: %v", l["time"], err)
		}
		return at
	}
	return time.Time{}
}

// TestFleetKeepListOnEveryServer: against the Go module's server and
// Debian's nats-server 2.9.10, an operator's ctl keep add says what the
// pattern covers; under lasting disk pressure a fresh agent (no saved
// list) keeps the image the fleet pattern names and the digest-pinned
// image of the same repository (its only name is repo@sha256:...), plan
// names the fleet list as the rule, the filler image goes, and no watch
// fails. On 7485972 both images went: the watch never started on 2.9.10,
// and app:* did not cover a digest reference on either server.
func TestFleetKeepListOnEveryServer(t *testing.T) {
	t.Parallel()
	forEachKeepServer(t, func(t *testing.T, v testenv.Version, kind string) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		ns := startKeepServer(t, kind, 0, "")
		out, err := gcagentCtl(t, "keep", "add", "registry.example/app:*", "--nats-url", ns.url, "--cluster", natsCluster)
		if err != nil {
			t.Fatalf("keep add: %v\n%s", err, out)
		}
		if !strings.Contains(out, "registry.example/app:* covers every tag of registry.example/app and every digest-pinned reference registry.example/app@sha256:") {
			t.Errorf("keep add does not say what the pattern covers:\n%s", out)
		}
		tagged := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "fleet-app-7", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "filler", Size: 3 << 20}}}
		c.Import(t, tagged, filler)
		pinned := importPinned(t, c, testenv.Image{Name: "registry.example/app:pinned", Layers: []testenv.Layer{{Seed: "fleet-app-pinned", Size: 2 << 20}}})
		if u := usagePercent(t, c.Root); u < 2 {
			t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
		}
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, "--nats-url", ns.url, "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "0s")
		natsWaitSynced(t, a)
		testenv.Eventually(t, 60*time.Second, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image, which nothing keeps, is still there"
			}
			return ""
		})
		for _, name := range []string{tagged.Name, pinned} {
			if imageGone(t, c, name) {
				t.Errorf("%s deleted although the fleet keep list names its repository", name)
			}
			if got := keptBy(a, name); got != "keep-pattern fleet keep list: registry.example/app:*" {
				t.Errorf("%s: plan says %q", name, got)
			}
		}
		m := mustMetrics(t, a)
		if n := metricSum(m, "gcagent_keep_list_watch_failures_total"); n != 0 {
			t.Errorf("%v keep list watch failures against %s", n, kind)
		}
		if metricSum(m, `gcagent_keep_list_state{state="known"}`) != 1 || metricSum(m, "gcagent_keep_list_waiting") != 0 {
			t.Errorf("keep list metrics:\n%s", grepLines(m, "gcagent_keep_list"))
		}
		if out, err := gcagentCtl(t, "keep", "ls", "--nats-url", ns.url); err != nil || !strings.Contains(out, "registry.example/app:*") {
			t.Errorf("keep ls against %s: %v\n%s", kind, err, out)
		}
	})
}

// TestFleetKeepListNATSDownAtStart: a fresh agent (no saved list) whose
// NATS does not answer at start, under lasting disk pressure with every
// image old enough: within --keep-list-wait it deletes nothing (every
// candidate is keep-list-unread), says so in /readyz, the waiting gauge
// and one log line; when the server comes up, it reads the list at once,
// keeps the image the fleet pattern names and deletes the other. On
// 7485972 both images went in the first pass.
func TestFleetKeepListNATSDownAtStart(t *testing.T) {
	t.Parallel()
	forEachKeepServer(t, func(t *testing.T, v testenv.Version, kind string) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		ns := startKeepServer(t, kind, 0, "")
		if out, err := gcagentCtl(t, "keep", "add", "registry.example/app:*", "--nats-url", ns.url, "--cluster", natsCluster); err != nil {
			t.Fatalf("keep add: %v\n%s", err, out)
		}
		ns.stop()
		kept := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "down-app", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "down-filler", Size: 3 << 20}}}
		c.Import(t, kept, filler)
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", ns.port),
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s",
			"--keep-list-wait", "10m")
		natsWaitSynced(t, a)
		// The decision while waiting: a pass ran under pressure and kept
		// both images for the unread list.
		testenv.Eventually(t, 60*time.Second, func() string {
			var st imgStatus
			if code, err := a.Get("/status", &st); err != nil || code != 200 || st.ImageGC == nil || st.ImageGC.LastPass == nil {
				return fmt.Sprintf("no image GC pass yet (%d %v)", code, err)
			}
			if p := st.ImageGC.LastPass; !p.Triggered || !strings.Contains(p.Shortfall, "keep-list-unread") {
				return fmt.Sprintf("last pass %+v: want a triggered pass short for keep-list-unread", p)
			}
			for _, name := range []string{kept.Name, filler.Name} {
				if got := keptBy(a, name); got != "keep-list-unread fleet keep list never read" {
					return name + ": " + got
				}
			}
			return ""
		})
		for _, name := range []string{kept.Name, filler.Name} {
			if imageGone(t, c, name) {
				t.Fatalf("%s deleted while the fleet keep list was never read", name)
			}
		}
		code, body, _ := readyz(a)
		if code != 200 || !strings.Contains(body, "fleet keep list: never read") || !strings.Contains(body, "image deletes by threshold or maximum age wait for it until") {
			t.Errorf("/readyz %d:\n%s", code, body)
		}
		// The first watch fails when its JetStream request times out.
		testenv.Eventually(t, 60*time.Second, func() string {
			m := mustMetrics(t, a)
			if metricSum(m, "gcagent_keep_list_waiting") != 1 || metricSum(m, `gcagent_keep_list_state{state="unknown"}`) != 1 ||
				metricSum(m, "gcagent_keep_list_watch_failures_total") < 1 {
				return "keep list metrics while waiting:\n" + grepLines(m, "gcagent_keep_list")
			}
			return ""
		})
		waiting := firstLogged(t, a, "no fleet keep list saved: image deletes by threshold or maximum age wait", nil)
		if waiting.IsZero() {
			t.Errorf("no log line says image deletes wait:\n%s", a.LogTail(30))
		}

		// NATS comes up with the list: read, the filler goes, the app stays.
		up := time.Now()
		startKeepServer(t, kind, ns.port, ns.store)
		testenv.Eventually(t, 60*time.Second, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image is still there after NATS came up: " + keptBy(a, filler.Name)
			}
			return ""
		})
		t.Logf("%s: list read and the filler deleted %s after NATS came up", kind, time.Since(up).Round(time.Millisecond))
		if imageGone(t, c, kept.Name) {
			t.Fatalf("%s deleted although the fleet keep list names it", kept.Name)
		}
		if got := keptBy(a, kept.Name); got != "keep-pattern fleet keep list: registry.example/app:*" {
			t.Errorf("%s: plan says %q", kept.Name, got)
		}
		// The agent logs a removal after containerd has done it.
		var removed, read time.Time
		testenv.Eventually(t, 30*time.Second, func() string {
			removed = firstLogged(t, a, "image removed", map[string]string{"image": filler.Name})
			read = firstLogged(t, a, "fleet keep list read from NATS for the first time", nil)
			if removed.IsZero() || read.IsZero() {
				return fmt.Sprintf("log lines: removed %s, read %s", removed, read)
			}
			return ""
		})
		if removed.Before(read) {
			t.Errorf("filler removed at %s, list read at %s: want a removal after the read", removed, read)
		}
		if code, body, _ := readyz(a); code != 200 || strings.Contains(body, "fleet keep list") {
			t.Errorf("/readyz after the read %d:\n%s", code, body)
		}
	})
}

// TestFleetKeepListWaitEnds: NATS never answers; once --keep-list-wait
// has passed, image GC goes on with --keep-image only and says so at
// warn: the image --keep-image names stays, the other goes, not before
// the wait ended.
func TestFleetKeepListWaitEnds(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		kept := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "wait-app", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "wait-filler", Size: 3 << 20}}}
		c.Import(t, kept, filler)
		const wait = 15 * time.Second
		state := filepath.Join(t.TempDir(), "state")
		a := testenv.StartAgent(t, c, state, "--nats-url", "nats://"+testenv.FreeAddr(t),
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s",
			"--keep-list-wait", wait.String(), "--keep-image", "registry.example/app")
		// While waiting: the plan keeps the filler for the unread list and
		// says until when (to the nanosecond; log lines have seconds).
		var until time.Time
		testenv.Eventually(t, 30*time.Second, func() string {
			var p struct {
				Images struct {
					KeepListWaitUntil time.Time `json:"keepListWaitUntil"`
				} `json:"images"`
			}
			if code, err := a.Get("/plan", &p); err != nil || code != 200 {
				return fmt.Sprintf("plan: %d %v", code, err)
			}
			if until = p.Images.KeepListWaitUntil; until.IsZero() {
				return "the plan does not wait for the keep list"
			}
			if got := keptBy(a, filler.Name); got != "keep-list-unread fleet keep list never read" {
				return filler.Name + ": " + got
			}
			return ""
		})
		if imageGone(t, c, filler.Name) {
			t.Fatalf("%s deleted while the plan waits for the keep list until %s", filler.Name, until)
		}
		var ended, removed time.Time
		testenv.Eventually(t, wait+60*time.Second, func() string {
			ended = firstLogged(t, a, "fleet keep list not read within --keep-list-wait: image GC goes on with --keep-image only", nil)
			removed = firstLogged(t, a, "image removed", map[string]string{"image": filler.Name})
			if !imageGone(t, c, filler.Name) || ended.IsZero() || removed.IsZero() {
				return fmt.Sprintf("filler gone %v, wait ended logged at %s, removal logged at %s: %s", imageGone(t, c, filler.Name), ended, removed, keptBy(a, filler.Name))
			}
			return ""
		})
		// Log times are whole seconds: a removal at until or later is
		// logged no earlier than until's second.
		if removed.Before(until.Truncate(time.Second)) || removed.Before(ended) {
			t.Errorf("filler removed at %s, the wait ends at %s (warning logged at %s)", removed, until, ended)
		}
		t.Logf("the wait ended at %s; warning logged at %s, filler removed at %s", until.Format(time.RFC3339Nano), ended, removed)
		if imageGone(t, c, kept.Name) {
			t.Errorf("%s deleted although --keep-image registry.example/app covers it", kept.Name)
		}
		if got := keptBy(a, kept.Name); got != "keep-pattern registry.example/app" {
			t.Errorf("%s: plan says %q", kept.Name, got)
		}
		if !logHas(t, a, `"covers":"every tag of registry.example/app and every digest-pinned reference registry.example/app@sha256:`) {
			t.Errorf("the start log does not say what --keep-image covers:\n%s", a.LogTail(40))
		}
		if code, body, _ := readyz(a); code != 200 || !strings.Contains(body, "the wait ended at") {
			t.Errorf("/readyz %d after the wait:\n%s", code, body)
		}
	})
}

// TestFleetKeepListThroughLeaf: an agent on a site's leaf server reads the
// fleet keep list from the hub's JetStream domain (--nats-js-domain hub),
// as it writes its events there, and keeps what the hub's list names; an
// operator's ctl keep add through the leaf writes the hub's bucket. Before,
// the watch asked the leaf's own domain, found no bucket there and took
// that for an empty list.
func TestFleetKeepListThroughLeaf(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		hub, leaf, _ := testenv.StartHubAndLeaf(t)
		if out, err := gcagentCtl(t, "keep", "add", "registry.example/app:*", "--nats-url", leaf.ClientURL(),
			"--nats-js-domain", testenv.HubDomain, "--cluster", natsCluster); err != nil {
			t.Fatalf("keep add through the leaf: %v\n%s", err, out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for url, want := range map[string]bool{hub.ClientURL(): true, leaf.ClientURL(): false} {
			js, _ := jetstream.New(natsConn(t, url))
			if _, err := js.KeyValue(ctx, natsbus.KeepBucket); (err == nil) != want {
				t.Errorf("bucket %s in the domain of %s: %v, want it there %v", natsbus.KeepBucket, url, err, want)
			}
		}
		kept := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "leaf-app", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "leaf-filler", Size: 3 << 20}}}
		c.Import(t, kept, filler)
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--nats-url", leaf.ClientURL(), "--nats-js-domain", testenv.HubDomain,
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s")
		testenv.Eventually(t, 60*time.Second, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image is still there: " + keptBy(a, filler.Name)
			}
			return ""
		})
		if imageGone(t, c, kept.Name) {
			t.Fatalf("%s deleted although the hub's fleet keep list names it", kept.Name)
		}
		if got := keptBy(a, kept.Name); got != "keep-pattern fleet keep list: registry.example/app:*" {
			t.Errorf("%s: plan says %q", kept.Name, got)
		}
	})
}
