package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/schema"
)

// regretsIn returns the image.regretted events of the stream, and the
// size image.removed published for each digest (the last removal).
func regretsIn(t *testing.T, evs []storedEvent) (regrets []schema.ImageRegret, removedBytes map[string]int64) {
	t.Helper()
	removedBytes = map[string]int64{}
	for _, ev := range evs {
		switch ev.KindAction {
		case "image.regretted":
			var d schema.ImageRegret
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("image.regretted data: %v: %s", err, ev.Data)
			}
			regrets = append(regrets, d)
		case "image.removed":
			var d schema.ImageEvent
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("image.removed data: %v", err)
			}
			removedBytes[d.Digest] = d.Size
		}
	}
	return regrets, removedBytes
}

// TestImageRegret: under lasting disk pressure the agent deletes every
// image; one imported again while the agent runs, and one imported again
// while it is stopped, are each reported once as image.regretted, with the
// bytes the removal published, and counted in the metrics.
func TestImageRegret(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		live := testenv.Image{Name: "example.test/back-live:1", Layers: []testenv.Layer{{Seed: "back-live", Size: 3 << 20}}}
		down := testenv.Image{Name: "example.test/back-down:1", Layers: []testenv.Layer{{Seed: "back-down", Size: 5 << 20}}}
		recs := c.Import(t, live, down)
		digest := map[string]string{}
		for _, r := range recs {
			digest[r.Name] = r.Target.Digest.String()
		}
		if u := usagePercent(t, c.Root); u < 2 {
			t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
		}
		state := filepath.Join(t.TempDir(), "state")
		// Usage stays above 1% and 0% is never reached: every image goes
		// as soon as it may.
		flags := []string{"--nats-url", ns.ClientURL(), "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "0s", "--regret-window", "1h"}
		a := testenv.StartAgent(t, c, state, flags...)
		natsWaitSynced(t, a)
		waitGone := func(names ...string) {
			testenv.Eventually(t, 60*time.Second, func() string {
				for _, n := range names {
					if !imageGone(t, c, n) {
						return n + " not deleted yet"
					}
				}
				return ""
			})
		}
		waitGone(live.Name, down.Name)

		// Back while the agent runs: pulled under a lease, as a pull is (the
		// agent, with no minimum age, may delete it as soon as it is whole).
		c.ImportLeased(t, live)
		waitRegret := func(name string) schema.ImageRegret {
			var got []schema.ImageRegret
			testenv.Eventually(t, 30*time.Second, func() string {
				got = got[:0]
				regrets, _ := regretsIn(t, readStream(t, nc))
				for _, r := range regrets {
					if r.Digest == digest[name] {
						got = append(got, r)
					}
				}
				if len(got) == 0 {
					return "no image.regretted for " + name
				}
				return ""
			})
			return got[0]
		}
		r := waitRegret(live.Name)
		t.Logf("%s regretted after %.1f s: %d bytes, rule %s, trigger %s", live.Name, r.ReturnAfterSeconds, r.Bytes, r.Rule, r.Trigger)
		waitGone(live.Name) // deleted again: the pressure lasts

		// Back while the agent is stopped: noticed by the listing after
		// the restart, from the deletion the projection persisted.
		a.Stop()
		c.Import(t, down)
		a = testenv.StartAgent(t, c, state, flags...)
		natsWaitSynced(t, a)
		r = waitRegret(down.Name)
		t.Logf("%s regretted across a restart after %.1f s: %d bytes", down.Name, r.ReturnAfterSeconds, r.Bytes)
		waitGone(down.Name)

		// Once each: give a second report time to appear, restart once
		// more (the journal says both were reported), and count.
		a.Stop()
		a = testenv.StartAgent(t, c, state, flags...)
		natsWaitSynced(t, a)
		time.Sleep(3 * time.Second) // a second report would be published at once after the sync
		regrets, removed := regretsIn(t, readStream(t, nc))
		count := map[string]int{}
		for _, r := range regrets {
			count[r.Digest]++
			if r.Bytes != removed[r.Digest] || r.Bytes <= 0 {
				t.Errorf("%s regretted with %d bytes, its removal published %d", r.Digest, r.Bytes, removed[r.Digest])
			}
			if r.Rule != "space" || r.Trigger == "" || r.DeletedAt.IsZero() || r.ReturnAfterSeconds <= 0 || !r.ReturnedAt.After(r.DeletedAt) {
				t.Errorf("regret %+v: want rule space, a trigger, deletion and return times", r)
			}
		}
		for _, name := range []string{live.Name, down.Name} {
			if count[digest[name]] != 1 {
				t.Errorf("%s regretted %d times, want once", name, count[digest[name]])
			}
		}
		checkContract(t, readStream(t, nc))
		// This boot counted none: both were reported by earlier boots.
		m, err := metricsText(a)
		if err != nil {
			t.Fatal(err)
		}
		if n := metricSum(m, "gcagent_image_gc_regret_total"); n != 0 {
			t.Errorf("gcagent_image_gc_regret_total %v after the last restart, want 0 (nothing new)", n)
		}
	})
}

// gcagentCtl runs the agent binary's ctl with args and returns its output.
func gcagentCtl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(testenv.AgentBinary(t), append([]string{"ctl"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestFleetKeepList: under lasting disk pressure, a pattern added to the
// fleet keep list keeps an image within 5 s on a running agent (its
// embedded NATS server holds the bucket), plan names the fleet list as
// the rule, and after keep rm the image goes.
func TestFleetKeepList(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		img := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "fleet-app", Size: 3 << 20}}}
		c.Import(t, testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "filler", Size: 3 << 20}}})
		if u := usagePercent(t, c.Root); u < 2 {
			t.Fatalf("image filesystem usage %d%%: no pressure to test", u)
		}
		state := filepath.Join(t.TempDir(), "state")
		// Under pressure (1%/0%), an image is protected only while it is
		// younger than 20 s: the keep list must act before that.
		a := testenv.StartAgent(t, c, state, "--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0",
			"--minimum-image-ttl-duration", "20s")
		natsWaitSynced(t, a)
		t.Cleanup(func() {
			if t.Failed() {
				for _, l := range imgAgentLog(t, a, "keeplist") {
					t.Logf("keeplist: %+v", l)
				}
				_, m, _ := a.GetText("/metrics")
				for _, l := range strings.Split(m, "\n") {
					if strings.HasPrefix(l, "gcagent_keep") {
						t.Log(l)
					}
				}
			}
		})
		testenv.Eventually(t, 20*time.Second, func() string {
			if _, body, _ := a.GetText("/metrics"); !strings.Contains(body, "gcagent_keep_list_age_seconds") {
				return "no keep list metric"
			}
			if code, body, _ := readyz(a); code != 200 || strings.Contains(body, "fleet keep list") {
				return fmt.Sprintf("/readyz %d %q", code, body)
			}
			return ""
		})
		c.Import(t, img)
		start := time.Now()
		if out, err := gcagentCtl(t, "keep", "add", "registry.example/app:*", "--state-dir", state); err != nil {
			t.Fatalf("keep add: %v\n%s", err, out)
		}
		type planDoc struct {
			Policy []struct{ Name, Value string } `json:"policy"`
			Images struct {
				Keep []struct {
					Names  []string `json:"names"`
					Reason string   `json:"reason"`
					Rule   string   `json:"rule"`
				} `json:"keep"`
			} `json:"images"`
		}
		keptBy := func() string {
			var p planDoc
			if code, err := a.Get("/plan", &p); err != nil || code != 200 {
				return fmt.Sprintf("plan: %d %v", code, err)
			}
			for _, k := range p.Images.Keep {
				for _, n := range k.Names {
					if n == img.Name {
						return k.Reason + " " + k.Rule
					}
				}
			}
			return "not in the plan's keep list"
		}
		testenv.EventuallyEvery(t, 5*time.Second, 100*time.Millisecond, func() string {
			if got := keptBy(); got != "keep-pattern fleet keep list: registry.example/app:*" {
				return got
			}
			return ""
		})
		t.Logf("kept by the fleet keep list %s after keep add", time.Since(start).Round(time.Millisecond))
		if out, err := gcagentCtl(t, "keep", "ls", "--state-dir", state); err != nil || !strings.Contains(out, "registry.example/app:*") {
			t.Fatalf("keep ls: %v\n%s", err, out)
		}
		// Past the minimum age, under pressure: still there, and the plan,
		// made now, keeps it by the fleet keep list. The sleep is the age
		// itself (20 s and a margin), not a wait for a result: no pass need
		// run when a kept image comes of age.
		time.Sleep(time.Until(start.Add(23 * time.Second)))
		if got := keptBy(); got != "keep-pattern fleet keep list: registry.example/app:*" {
			t.Errorf("past its minimum age, %s is kept by: %s", img.Name, got)
		}
		if imageGone(t, c, img.Name) {
			t.Fatalf("%s deleted although the fleet keep list names it", img.Name)
		}
		if !imageGone(t, c, "example.test/filler:1") {
			t.Fatal("the filler image, not kept, is still there: no pressure?")
		}

		rmAt := time.Now()
		if out, err := gcagentCtl(t, "keep", "rm", "registry.example/app:*", "--state-dir", state); err != nil {
			t.Fatalf("keep rm: %v\n%s", err, out)
		}
		testenv.Eventually(t, 10*time.Second, func() string {
			if !imageGone(t, c, img.Name) {
				return img.Name + " not deleted after keep rm"
			}
			return ""
		})
		t.Logf("deleted %s after keep rm", time.Since(rmAt).Round(time.Millisecond))
	})
}
