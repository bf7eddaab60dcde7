package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// lastLine is the last line an agent wrote (its exit error, when it
// refused to run).
func lastLine(a *testenv.Agent) string { return a.LogTail(1) }

// waitHolding waits for the agent to log that it holds the agent lock.
func waitHolding(t *testing.T, a *testenv.Agent) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() string {
		if !logHas(t, a, "holding containerd's agent lock") {
			return "the agent does not hold the agent lock:\n" + a.LogTail(5)
		}
		return ""
	})
}

// lockLeases lists the agent lock's leases in containerd.
func lockLeases(t *testing.T, c *testenv.Containerd) map[string]map[string]string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), events.AgentNamespace)
	ls, err := c.Client.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, l := range ls {
		out[l.ID] = l.Labels
		if res, err := c.Client.LeasesService().ListResources(ctx, l); err != nil || len(res) != 0 {
			t.Errorf("lease %s holds %v (%v): it must protect nothing from containerd's GC", l.ID, res, err)
		}
	}
	return out
}

// TestOneAgentPerContainerd: two real agents on one daemon with different
// state dirs: the second exits at once with one line naming the first
// (node, pid, state dir), and starts nothing; with --take-over a third
// takes over, and the first stops saying who took over; after kill -9 of
// the holder, its restart on the same state dir holds the lock at once,
// and so does an agent of another state dir after its kill -9 (its
// process is gone). The lock is a lease in its own namespace, which no
// agent manages, --namespace=* included, and which holds nothing.
func TestOneAgentPerContainerd(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		dir := t.TempDir()
		state := func(name string) string { return filepath.Join(dir, name) }
		observe := []string{"--namespace=*", "--prune-containers=off", "--image-gc-high-threshold=100"}
		c.Import(t, testenv.Image{Name: "example.test/one:1", Layers: []testenv.Layer{{Seed: "one", Size: 1024}}})

		first := testenv.StartAgent(t, c, state("first"), observe...)
		waitHolding(t, first)
		waitSynced(t, first)

		second := testenv.StartAgent(t, c, state("second"), observe...)
		if !second.Exited(60 * time.Second) {
			t.Fatalf("a second agent on the same containerd runs:\n%s", second.LogTail(10))
		}
		refusal := lastLine(second)
		t.Logf("the second agent: %s", refusal)
		for _, want := range []string{"another gcagent runs on this containerd", "node test-node",
			fmt.Sprintf("pid %d", first.Pid()), "state dir " + state("first"), "--take-over"} {
			if !strings.Contains(refusal, want) {
				t.Errorf("the refusal %q does not say %q", refusal, want)
			}
		}
		// Its log has the start line (the first line of every start says
		// what runs) and then the refusal; it never got as far as NATS.
		if b, _ := os.ReadFile(second.LogFile); strings.Count(string(b), "another gcagent runs on this containerd") != 1 ||
			strings.Contains(string(b), "embedded NATS server started") || strings.Contains(string(b), "event outbox open") {
			t.Errorf("the second agent started, or refused more than once:\n%s", b)
		}
		if code, _ := first.Get("/healthz", nil); code != 200 {
			t.Errorf("the first agent does not serve after the second refused: %d", code)
		}

		// The lock: one lease, in its own namespace, naming the first.
		leases := lockLeases(t, c)
		if len(leases) != 1 {
			t.Fatalf("lock leases %v, want one", leases)
		}
		for id, labels := range leases {
			if !strings.HasPrefix(id, "lock.") || labels["gcagent.io/state-dir"] != state("first") || labels["gcagent.io/pid"] != fmt.Sprint(first.Pid()) {
				t.Errorf("lease %s labels %v, want the first agent's", id, labels)
			}
		}
		var rep projection.Report
		if code, err := first.Get("/status", &rep); code != 200 || err != nil {
			t.Fatalf("status: %d %v", code, err)
		}
		for _, ns := range rep.Namespaces {
			if ns == events.AgentNamespace {
				t.Errorf("an agent with --namespace=* manages the lock's namespace: %v", rep.Namespaces)
			}
		}

		third := testenv.StartAgent(t, c, state("third"), append(observe, "--take-over")...)
		waitHolding(t, third)
		if !first.Exited(60 * time.Second) {
			t.Fatalf("the first agent runs on after a take-over:\n%s", first.LogTail(10))
		}
		lost := lastLine(first)
		t.Logf("the first agent: %s", lost)
		for _, want := range []string{"another gcagent took this containerd over", fmt.Sprintf("pid %d", third.Pid()), "state dir " + state("third")} {
			if !strings.Contains(lost, want) {
				t.Errorf("the first agent's last line %q does not say %q", lost, want)
			}
		}
		if !logHas(t, third, `"reason":"--take-over"`) {
			t.Errorf("the taker does not say it took over:\n%s", third.LogTail(10))
		}
		waitSynced(t, third)

		// kill -9 of the holder, then its restart on the same state dir.
		third.Kill()
		began := time.Now()
		again := testenv.StartAgent(t, c, state("third"), observe...)
		waitHolding(t, again)
		t.Logf("restart after kill -9 holds the lock after %s", time.Since(began).Round(time.Millisecond))
		if !logHas(t, again, `"reason":"the last run of this state dir"`) {
			t.Errorf("the restart did not take its own lock back:\n%s", again.LogTail(10))
		}
		waitSynced(t, again)

		// kill -9 again; an agent of another state dir finds its process gone.
		again.Kill()
		other := testenv.StartAgent(t, c, state("first"), observe...)
		waitHolding(t, other)
		if !logHas(t, other, `"reason":"its process is gone"`) {
			t.Errorf("the agent after a killed one did not find it gone:\n%s", other.LogTail(10))
		}
		waitSynced(t, other)
		if n := len(lockLeases(t, c)); n != 1 {
			t.Errorf("%d lock leases, want one", n)
		}
		other.Stop()
		if n := len(lockLeases(t, c)); n != 0 {
			t.Errorf("%d lock leases after a clean stop, want none (released)", n)
		}
	})
}

// TestOneAgentPerContainerdAcrossNamespaces: the layout of a systemd unit
// beside a DaemonSet pod: the second agent runs in its own pid and mount
// namespaces (unshare), so it can neither see the first's process nor its
// state dir's lock. It still refuses, naming the first, once it has seen
// the first renew the lock; and after kill -9 of the first it takes the
// lock over only once three renewals are missed (30 s).
func TestOneAgentPerContainerdAcrossNamespaces(t *testing.T) {
	t.Parallel()
	testenv.Require(t, func() bool { _, err := exec.LookPath("unshare"); return err == nil }(), "unshare (util-linux)")
	bin := testenv.AgentBinary(t)
	pod := filepath.Join(t.TempDir(), "gcagent-in-pod")
	script := "#!/bin/sh\nexec unshare --pid --fork --kill-child --mount-proc " + bin + " \"$@\"\n"
	if err := os.WriteFile(pod, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		c.Import(t, testenv.Image{Name: "example.test/one:1", Layers: []testenv.Layer{{Seed: "one", Size: 1024}}})
		dir := t.TempDir()
		observe := []string{"--prune-containers=off", "--image-gc-high-threshold=100"}

		unit := testenv.StartAgent(t, c, filepath.Join(dir, "unit"), observe...)
		waitHolding(t, unit)
		inPod := testenv.StartAgentBin(t, pod, c, filepath.Join(dir, "pod"), nil, observe...)
		if !inPod.Exited(60 * time.Second) {
			t.Fatalf("an agent in another pid namespace runs beside the first:\n%s", inPod.LogTail(10))
		}
		refusal := lastLine(inPod)
		t.Logf("the agent in the pod: %s", refusal)
		for _, want := range []string{"another gcagent runs on this containerd", fmt.Sprintf("pid %d (in another pid namespace)", unit.Pid()),
			"state dir " + filepath.Join(dir, "unit")} {
			if !strings.Contains(refusal, want) {
				t.Errorf("the refusal %q does not say %q", refusal, want)
			}
		}

		unit.Kill()
		killed := time.Now()
		inPod = testenv.StartAgentBin(t, pod, c, filepath.Join(dir, "pod"), nil, observe...)
		waitHolding(t, inPod)
		took := time.Since(killed)
		t.Logf("the agent in the pod holds the lock %s after kill -9 of the first", took.Round(time.Millisecond))
		if took < 20*time.Second {
			t.Errorf("took the lock %s after kill -9 of a holder it cannot see, before it could have missed three renewals", took)
		}
		if !logHas(t, inPod, `"reason":"not renewed for 30s"`) {
			t.Errorf("the agent in the pod does not say why it took over:\n%s", inPod.LogTail(10))
		}
		waitSynced(t, inPod)
	})
}

// TestSecondTakeOverRefused: two agents started with --take-over do not
// take containerd from each other: the first takes it over from the
// agent that held it, and a second one, started within 5 minutes of
// that, exits at once with one line naming the holder, saying that it
// took over itself and when --take-over may be tried again; the holder
// runs on, the lock its own.
func TestSecondTakeOverRefused(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		dir := t.TempDir()
		state := func(name string) string { return filepath.Join(dir, name) }
		observe := []string{"--prune-containers=off", "--image-gc-high-threshold=100"}

		first := testenv.StartAgent(t, c, state("first"), observe...)
		waitHolding(t, first)
		taker := testenv.StartAgent(t, c, state("taker"), append(observe, "--take-over")...)
		waitHolding(t, taker)
		if !logHas(t, taker, `"reason":"--take-over"`) {
			t.Fatalf("the first --take-over did not take over:\n%s", taker.LogTail(10))
		}
		if !first.Exited(60 * time.Second) {
			t.Fatalf("the agent taken over runs on:\n%s", first.LogTail(10))
		}

		second := testenv.StartAgent(t, c, state("second"), append(observe, "--take-over")...)
		if !second.Exited(60 * time.Second) {
			t.Fatalf("a second --take-over runs beside the first:\n%s", second.LogTail(10))
		}
		refusal := lastLine(second)
		t.Logf("the second --take-over: %s", refusal)
		for _, want := range []string{"another gcagent runs on this containerd", fmt.Sprintf("pid %d", taker.Pid()),
			"state dir " + state("taker"), "took containerd over itself recently", "--take-over is refused for up to", "start this one again then"} {
			if !strings.Contains(refusal, want) {
				t.Errorf("the refusal %q does not say %q", refusal, want)
			}
		}
		if code, _ := taker.Get("/healthz", nil); code != 200 {
			t.Errorf("the holder does not serve after the second --take-over: %d", code)
		}
		for id, labels := range lockLeases(t, c) {
			if labels["gcagent.io/state-dir"] != state("taker") {
				t.Errorf("lease %s labels %v, want the holder's", id, labels)
			}
		}
	})
}
