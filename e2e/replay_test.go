package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/replay"
	"github.com/gcagent/gcagent/trace"
)

// replayTolerance bounds how much earlier than the agent the replay may
// delete an image (never later): the replay deletes at the instant of the
// measurement or record that starts a pass, and all of a pass's images at
// that instant, while the agent starts its pass a debounce later and
// deletes one image after the other through containerd, measuring the
// disk after each.
const replayTolerance = 10 * time.Second

// TestReplayReproducesTheAgent: the agent runs under disk pressure with
// images used in an order unlike their arrival's, deleted, pulled again
// and deleted again; its usage trace, exported, replayed with the policy
// that ran reproduces its deletions (the same images in the same order,
// each at most replayTolerance earlier) and its re-pulls, and the trace's
// deletions are the images containerd lost.
func TestReplayReproducesTheAgent(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		testenv.Require(t, testenv.HasBusybox(), "busybox-static (make deps)")
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		img := func(name string) testenv.Image {
			return testenv.Runnable("example.test/replay-"+name+":1", testenv.Layer{Seed: "replay-" + name, Size: 4 << 20})
		}
		r, a, b, cc, d := img("r"), img("a"), img("b"), img("c"), img("d")
		digest := map[string]string{}
		for _, rec := range c.Import(t, r, a, b, cc, d) {
			digest[rec.Target.Digest.String()] = rec.Name
		}
		keeper := c.RunNative(t, "replay-keeper", r.Name, "sleep", "3600") // r stays in use
		t.Cleanup(func() { c.DeleteNative(t, keeper) })
		u1 := usagePercent(t, c.Root)
		high, low := u1+4, u1-10
		if low < 1 || high > 99 {
			t.Fatalf("usage %d%% with five images: no room for the thresholds", u1)
		}
		state := filepath.Join(t.TempDir(), "state")
		const minAge = 15 * time.Second
		ag := testenv.StartAgent(t, c, state, "--image-gc-high-threshold", fmt.Sprint(high),
			"--image-gc-low-threshold", fmt.Sprint(low), "--minimum-image-ttl-duration", minAge.String())
		natsWaitSynced(t, ag)
		synced := time.Now()

		// Used in the order c, a, d, b: least recently used is c.
		for i, im := range []testenv.Image{cc, a, d, b} {
			ctr := c.RunNative(t, fmt.Sprintf("replay-use-%d", i), im.Name, "true")
			c.WaitExit(t, ctr)
			c.DeleteNative(t, ctr)
		}
		time.Sleep(time.Until(synced.Add(minAge + 2*time.Second))) // all past the minimum age
		gone := func(names ...string) {
			t.Helper()
			testenv.Eventually(t, 60*time.Second, func() string {
				for _, n := range names {
					if !imageGone(t, c, n) {
						return n + " not deleted yet"
					}
				}
				return ""
			})
		}
		e := img("e")
		importNamed(c, t, digest, e) // over the high threshold: c, a, d go
		gone(cc.Name, a.Name, d.Name)
		importNamed(c, t, digest, cc, a) // both come back
		// Both past the minimum age: the age itself, not a wait for a result.
		time.Sleep(minAge + 2*time.Second)
		importNamed(c, t, digest, img("f")) // over again: e (never used), c, a
		gone(e.Name, cc.Name, a.Name)
		time.Sleep(3 * time.Second) // a pass after the last delete finds nothing more

		// Replayed from the running agent (its /trace), then from the
		// file a stopped agent left, exported.
		fromAgent := replayJSON(t, "--metrics-address", ag.Addr, "--state-dir", state)
		ag.Stop()
		file := filepath.Join(t.TempDir(), "trace.jsonl")
		out, err := exec.Command(testenv.AgentBinary(t), "trace", "export", "--state-dir", state,
			"--metrics-address", testenv.FreeAddr(t)).Output()
		if err != nil {
			t.Fatalf("trace export: %v", err)
		}
		if err := os.WriteFile(file, out, 0o600); err != nil {
			t.Fatal(err)
		}
		fromFile := replayJSON(t, "--trace", file)
		for name, res := range map[string]replay.Result{"agent": fromAgent, "file": fromFile} {
			t.Run(name, func(t *testing.T) { checkReplay(t, res, digest) })
		}
		// The opt-in order on the same trace (docs/figures.md#replay).
		gdsf := replayJSON(t, "--trace", file, "--order", "gdsf")
		t.Logf("on this trace: lru re-pulls %d (%d bytes), gdsf %d (%d bytes), mean free %.1f%% and %.1f%%",
			fromFile.Replayed.Repulls, fromFile.Replayed.RepulledBytes, gdsf.Replayed.Repulls, gdsf.Replayed.RepulledBytes,
			fromFile.Replayed.MeanFree, gdsf.Replayed.MeanFree)
		if gdsf.Replayed.Deletions == 0 || gdsf.Policy.Order != replay.OrderGDSF {
			t.Errorf("gdsf replay: %d deletions, order %q", gdsf.Replayed.Deletions, gdsf.Policy.Order)
		}
		var header trace.Record
		if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &header); err != nil ||
			header.Ev != trace.KindHeader || header.Version != trace.Version || header.Node != "test-node" {
			t.Errorf("export header %+v (%v)", header, err)
		}
	})
}

// importNamed imports images and notes their digests' names.
func importNamed(c *testenv.Containerd, t *testing.T, digest map[string]string, imgs ...testenv.Image) {
	t.Helper()
	for _, rec := range c.Import(t, imgs...) {
		digest[rec.Target.Digest.String()] = rec.Name
	}
}

// replayJSON runs gcagent replay --json --detail with args.
func replayJSON(t *testing.T, args ...string) replay.Result {
	t.Helper()
	cmd := exec.Command(testenv.AgentBinary(t), append([]string{"replay", "--json", "--detail"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gcagent replay %v: %v\n%s", args, err, stderr.String())
	}
	var res replay.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("replay output: %v\n%s", err, out)
	}
	return res
}

func checkReplay(t *testing.T, res replay.Result, digest map[string]string) {
	rec, rep := res.Recorded, res.Replayed
	name := func(d replay.Deletion) string { return strings.TrimPrefix(digest[d.Digest], "example.test/replay-") }
	var recNames, repNames []string
	for _, d := range rec.Deleted {
		recNames = append(recNames, name(d))
	}
	for _, d := range rep.Deleted {
		repNames = append(repNames, name(d))
	}
	t.Logf("recorded %v (%d re-pulls), replayed %v (%d re-pulls), footprint ratio %.2f", recNames, rec.Repulls,
		repNames, rep.Repulls, res.FootprintRatio)
	// c, a, d by their last use; then e (never used) and c and a, back
	// but never used, in the order they arrived.
	if got := strings.Join(recNames, " "); got != "c:1 a:1 d:1 e:1 c:1 a:1" && got != "c:1 a:1 d:1 e:1 a:1 c:1" {
		t.Errorf("the trace's deletions %v, want c a d e, then c and a (what containerd lost)", recNames)
	}
	if strings.Join(repNames, " ") != strings.Join(recNames, " ") {
		t.Fatalf("replayed %v, recorded %v", repNames, recNames)
	}
	var worst time.Duration
	for i := range rec.Deleted {
		early := rec.Deleted[i].T.Sub(rep.Deleted[i].T)
		worst = max(worst, early)
		if early < 0 || early > replayTolerance {
			t.Errorf("deletion %d (%s): replayed %s before the agent's, want 0..%s", i, recNames[i], early, replayTolerance)
		}
	}
	t.Logf("the replay deleted at most %s before the agent", worst)
	if rec.Repulls != 2 || rep.Repulls != rec.Repulls || rep.RepulledBytes != rec.RepulledBytes {
		t.Errorf("re-pulls: recorded %d (%d bytes), replayed %d (%d bytes); want 2 each", rec.Repulls, rec.RepulledBytes,
			rep.Repulls, rep.RepulledBytes)
	}
	if rec.PeakUsage != rep.PeakUsage {
		t.Errorf("peak usage: recorded %d%%, replayed %d%%", rec.PeakUsage, rep.PeakUsage)
	}
}
