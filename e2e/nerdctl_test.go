package e2e

// nerdctl is not installed where these tests run. Following FIELD-2026 §5
// (nerdctl's pkg/labels, pkg/namestore, pkg/dnsutil/hostsstore,
// pkg/cmd/container/create.go and remove.go), the containers below are
// made as nerdctl makes them, through the containerd client: plain
// containers of namespace default carrying nerdctl's labels, whose state
// outside containerd (name lock, hosts dir, state dir with the json log,
// a volume) is laid out by the test under a temporary data root. Nothing
// here was made by nerdctl itself, and no OCI hook runs.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/gcagent/gcagent/internal/testenv"
)

const (
	ncImage = "example.test/nerdctl-app:1"
	ncNS    = "default"
	// ncStore is the store nerdctl names after its containerd address
	// (the first 8 hex digits of a sha256): that of nerdctl#499.
	ncStore = "1935db59"
)

// ncID returns a nerdctl-like container id: 64 hex digits.
func ncID(name string) string {
	sum := sha256.Sum256([]byte("gcagent-e2e-nerdctl/" + name))
	return hex.EncodeToString(sum[:])
}

// ncDataRoot is a nerdctl data root as nerdctl lays it out.
type ncDataRoot struct {
	root, store string
}

func newNCDataRoot(root string) ncDataRoot {
	return ncDataRoot{root: root, store: filepath.Join(root, ncStore)}
}

func (d ncDataRoot) nameLock(name string) string { return filepath.Join(d.store, "names", ncNS, name) }
func (d ncDataRoot) hostsDir(id string) string   { return filepath.Join(d.store, "etchosts", ncNS, id) }
func (d ncDataRoot) stateDir(id string) string   { return filepath.Join(d.store, "containers", ncNS, id) }

// lay writes what nerdctl run --name name keeps for container id: the name
// lock holding lockHolder, the hosts dir, the state dir with its json log.
func (d ncDataRoot) lay(t *testing.T, name, id, lockHolder string) {
	t.Helper()
	ncFile(t, d.nameLock(name), lockHolder)
	ncFile(t, filepath.Join(d.hostsDir(id), "hosts"), "127.0.0.1\tlocalhost\n::1\tlocalhost\n10.4.0.2\t"+id[:12]+" "+name+"\n")
	ncFile(t, filepath.Join(d.hostsDir(id), "meta.json"), `{"ID":"`+id+`","Networks":{"bridge":{}},"Hostname":"`+id[:12]+`","Name":"`+name+`"}`)
	ncFile(t, filepath.Join(d.stateDir(id), id+"-json.log"),
		strings.Repeat(`{"log":"hello from `+name+`\n","stream":"stdout","time":"2026-01-02T03:04:05.000000000Z"}`+"\n", 200))
	ncFile(t, filepath.Join(d.stateDir(id), "log-config.json"), `{"driver":"json-file","opts":{},"logURI":""}`)
	ncFile(t, filepath.Join(d.stateDir(id), "logger-lock"), "")
	ncFile(t, filepath.Join(d.stateDir(id), "resolv.conf"), "nameserver 10.4.0.1\n")
}

// labels are the labels nerdctl run --name name sets (withInternalLabels),
// with its state dir at stateDir.
func (d ncDataRoot) labels(name, id, stateDir string) map[string]string {
	return map[string]string{
		"nerdctl/namespace":  ncNS,
		"nerdctl/name":       name,
		"nerdctl/hostname":   id[:12],
		"nerdctl/domainname": "",
		"nerdctl/extraHosts": "null",
		"nerdctl/networks":   `["bridge"]`,
		"nerdctl/state-dir":  stateDir,
		"nerdctl/log-uri":    "binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=" + d.root,
		"nerdctl/platform":   "linux/amd64",
	}
}

func ncFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runNerdctlLike creates container id with labels in d's namespace and
// starts args in it, as nerdctl run -d does (a task that keeps its exit
// status until someone deletes it).
func runNerdctlLike(t *testing.T, d *testenv.Containerd, id string, labels map[string]string, args ...string) {
	t.Helper()
	ctx := d.Ctx()
	ctr := d.CreateNative(t, id, ncImage, args...)
	if _, err := ctr.SetLabels(ctx, labels); err != nil {
		t.Fatalf("label %s: %v", id, err)
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
}

// ncRemoval is the data of a container.removed event as this test reads it.
type ncRemoval struct {
	Namespace  string `json:"namespace"`
	ID         string `json:"id"`
	Kind       string `json:"kind"`
	OwnerState *struct {
		Owner      string   `json:"owner"`
		Removed    []string `json:"removed"`
		Bytes      int64    `json:"bytes"`
		NameHeldBy string   `json:"nameHeldBy"`
		Error      string   `json:"error"`
	} `json:"ownerState"`
}

// ncLogLine is a line of the agent's log as this test reads it.
type ncLogLine struct {
	Component string `json:"component"`
	Message   string `json:"message"`
	Namespace string `json:"namespace"`
	Container string `json:"container"`
	Liveness  string `json:"liveness"`
	Detail    string `json:"detail"`
}

func ncAgentLog(t *testing.T, a *testenv.Agent) []ncLogLine {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []ncLogLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l ncLogLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// TestNerdctlContainers: dead containers made as nerdctl makes them
// (namespace default, nerdctl's labels and on-disk state; see the top of
// the file) are removed by the agent with what `nerdctl rm` removes: web's
// name lock, hosts dir and state dir go, and its container.removed event
// lists them with their bytes; api's name lock, which holds another id (a
// later nerdctl run --name api), stays while its hosts and state dirs go;
// a volume and a running container's files are untouched. A container
// whose nerdctl/state-dir lies outside --nerdctl-data-root is never
// deleted, its state untouched, and the agent logs why it keeps it.
func TestNerdctlContainers(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		d := c.InNamespace(ncNS)
		d.Import(t, testenv.Runnable(ncImage))
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())

		base := t.TempDir()
		dr := newNCDataRoot(filepath.Join(base, "nerdctl"))
		other := newNCDataRoot(filepath.Join(base, "other-root")) // another nerdctl's data root
		web, api, apiNow, db, stray := ncID("web"), ncID("api"), ncID("api-now"), ncID("db"), ncID("stray")
		dr.lay(t, "web", web, web)
		dr.lay(t, "api", api, apiNow) // nerdctl run --name api made apiNow since
		dr.lay(t, "db", db, db)
		ncFile(t, filepath.Join(dr.store, "volumes", ncNS, "v1", "_data", "keep.txt"), "volume data\n")
		other.lay(t, "stray", stray, stray)

		// What must stay: the whole data root but web's three paths and
		// api's hosts and state dirs; the other data root entirely.
		before := treeHash(t, dr.root, other.root)
		goes := []string{dr.nameLock("web"), dr.hostsDir(web), dr.stateDir(web), dr.hostsDir(api), dr.stateDir(api)}
		want := map[string]string{}
		for p, h := range before {
			if !slices.ContainsFunc(goes, func(g string) bool { return p == g || strings.HasPrefix(p, g+"/") }) {
				want[p] = h
			}
		}

		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
			"--namespace="+ncNS, "--prune-containers=native", "--nerdctl-data-root="+dr.root,
			"--nats-url", ns.ClientURL(), "--image-gc-high-threshold=100",
			"--uncollected-exit-grace=1s", "--minimum-container-ttl-duration=0s")
		natsWaitSynced(t, a)

		runNerdctlLike(t, d, db, dr.labels("db", db, dr.stateDir(db)), "sleep", "600")
		runNerdctlLike(t, d, web, dr.labels("web", web, dr.stateDir(web)), "true")
		runNerdctlLike(t, d, api, dr.labels("api", api, dr.stateDir(api)), "sh", "-c", "exit 3")
		runNerdctlLike(t, d, stray, dr.labels("stray", stray, other.stateDir(stray)), "true")

		// web and api: removed, each with one event listing what was cleaned.
		var evs []storedEvent
		testenv.Eventually(t, 60*time.Second, func() string {
			var why string
			if evs, why = deliveredStream(t, a, nc); why != "" {
				return why
			}
			got := subjectsOf(evs, "container.removed")
			for _, id := range []string{web, api} {
				if got[id] == 0 {
					return "no container.removed for " + id[:12] + " yet"
				}
			}
			return ""
		})
		checkContract(t, evs)
		removals := map[string]ncRemoval{}
		for _, ev := range evs {
			if ev.KindAction != "container.removed" {
				continue
			}
			var r ncRemoval
			if err := json.Unmarshal(ev.Data, &r); err != nil {
				t.Fatalf("container.removed data: %v: %s", err, ev.Data)
			}
			if _, dup := removals[r.ID]; dup {
				t.Errorf("two container.removed events for %s", r.ID)
			}
			removals[r.ID] = r
		}
		for id := range removals {
			if id != web && id != api {
				t.Errorf("container.removed for %s, want only web and api", id)
			}
		}
		for _, id := range []string{web, api} {
			if nativeExists(t, d, id) {
				t.Errorf("%s is still in containerd after its container.removed", id[:12])
			}
		}
		check := func(who, id string, wantRemoved []string, heldBy string) {
			t.Helper()
			r := removals[id]
			if r.Namespace != ncNS || r.Kind != "native" {
				t.Errorf("%s: namespace %q kind %q, want %s native", who, r.Namespace, r.Kind, ncNS)
			}
			o := r.OwnerState
			if o == nil {
				t.Errorf("%s: the event has no ownerState", who)
				return
			}
			t.Logf("%s: ownerState %+v", who, *o)
			if o.Owner != "nerdctl" || !slices.Equal(o.Removed, wantRemoved) || o.NameHeldBy != heldBy || o.Error != "" {
				t.Errorf("%s: ownerState %+v, want owner nerdctl, removed %v, nameHeldBy %q, no error", who, *o, wantRemoved, heldBy)
			}
			if o.Bytes < 200*80 { // at least the json log
				t.Errorf("%s: ownerState bytes %d, want at least the json log's", who, o.Bytes)
			}
			for _, p := range wantRemoved {
				if exists(p) {
					t.Errorf("%s: %s is still there", who, p)
				}
			}
		}
		check("web", web, []string{dr.nameLock("web"), dr.hostsDir(web), dr.stateDir(web)}, "")
		check("api", api, []string{dr.hostsDir(api), dr.stateDir(api)}, apiNow)
		if b, err := os.ReadFile(dr.nameLock("api")); err != nil || string(b) != apiNow {
			t.Errorf("api's name lock, held by another container: %q %v, want it kept holding %s", b, err, apiNow[:12])
		}

		// stray: kept, the reason logged; its state is not touched.
		var kept ncLogLine
		testenv.Eventually(t, 30*time.Second, func() string {
			for _, l := range ncAgentLog(t, a) {
				if l.Message == "kept on re-check" && l.Container == stray {
					kept = l
					return ""
				}
			}
			return "no 'kept on re-check' logged for stray"
		})
		t.Logf("stray: kept on re-check, liveness %s: %s", kept.Liveness, kept.Detail)
		if kept.Namespace != ncNS || kept.Liveness != "owner-state" || !strings.Contains(kept.Detail, "is not under the data root") ||
			!strings.Contains(kept.Detail, other.stateDir(stray)) {
			t.Errorf("stray kept in %q as %q because %q, want owner-state because its state dir %s is not under the data root",
				kept.Namespace, kept.Liveness, kept.Detail, other.stateDir(stray))
		}
		for _, id := range []string{stray, db} {
			if !nativeExists(t, d, id) {
				t.Errorf("%s was deleted", id[:12])
			}
		}
		m := mustMetrics(t, a)
		if metricSum(m, `gcagent_container_gc_kept_on_recheck_total{liveness="owner-state"}`) < 1 {
			t.Errorf("metrics count no container kept for owner-state")
		}
		a.Stop()

		after := treeHash(t, dr.root, other.root)
		for p, h := range want {
			if g, ok := after[p]; !ok {
				t.Errorf("%s is gone", p)
			} else if g != h {
				t.Errorf("%s changed: %s, was %s", p, g, h)
			}
		}
		for p := range after {
			if _, ok := want[p]; !ok {
				t.Errorf("%s is there (%s)", p, after[p])
			}
		}
	})
}
