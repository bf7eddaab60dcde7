package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/projection"
)

// TestEpisode: usage crosses the high threshold while three of five
// candidates are younger than the minimum age, imported a few seconds
// apart. The first pass frees the two eligible ones and leaves usage between
// the thresholds; each of the others is freed in the same GC episode when
// it comes of age, and the last brings usage to the low threshold. Then the
// episode is over: a later change between the thresholds runs no pass.
//
// The crossing is a file written straight to the image filesystem, which
// no containerd event announces: the test asserts that a pass starts on
// it and prints how long after the write it started.
func TestEpisode(t *testing.T) {
	// Not parallel: its images must come of age in a planned order a few
	// seconds apart, which imports slowed by other tests may upset.
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testEpisode(t, v) })
	}
}

// episodeStatus is the part of /status this test reads.
type episodeStatus struct {
	projection.Report
	ImageGC *struct {
		Usage    int           `json:"usage"`
		Passes   int           `json:"passes"`
		LastPass *gc.ImagePass `json:"lastPass"`
		Episode  time.Time     `json:"episode"`
		Above    bool          `json:"aboveHigh"`
	} `json:"imageGC"`
}

// episodeLogLine is one line of the agent's log with the pass fields.
type episodeLogLine struct {
	Component string `json:"component"`
	Message   string `json:"message"`
	Pass      string `json:"pass"`
	Trigger   string `json:"trigger"`
	Digest    string `json:"digest"`
}

// episodePasses reads the agent's log: the trigger of every image GC pass
// in the order they started, and the trigger of the pass each removed
// image (by digest) went in.
func episodePasses(t *testing.T, a *testenv.Agent) (triggers []string, removedBy map[string]string) {
	t.Helper()
	b, err := os.ReadFile(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	byPass, removedBy := map[string]string{}, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l episodeLogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Component != "imagegc" {
			continue
		}
		switch l.Message {
		case "image gc pass started":
			byPass[l.Pass] = l.Trigger
			triggers = append(triggers, l.Trigger)
		case "image removed":
			removedBy[l.Digest] = byPass[l.Pass]
		}
	}
	return triggers, removedBy
}

func testEpisode(t *testing.T, v testenv.Version) {
	const ttl = 10 * time.Second
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "256m"})
	digest := map[string]string{}
	importImage := func(name string) {
		recs := c.Import(t, testenv.Image{Name: name, Layers: []testenv.Layer{{Seed: "episode-" + name, Size: 8 * imgMiB}}})
		digest[name] = recs[0].Target.Digest.String()
	}
	old := []string{"example.test/old-1:1", "example.test/old-2:1"}
	young := []string{"example.test/young-1:1", "example.test/young-2:1", "example.test/young-3:1"}

	// What one image takes (blob and snapshot), measured.
	importImage(old[0])
	capacity, u1 := imgDisk(t, c.Root)
	importImage(old[1])
	_, u2 := imgDisk(t, c.Root)
	per := u2 - u1
	// Thresholds for the disk as it will be: the five images and a fill
	// of three images' bytes. The first pass (two images) ends below the
	// high threshold by one image; four deletions do not reach the low
	// threshold, five do, by half an image each way. Usage reaches high
	// (rounded up, as the kubelet's) above high-1 percent.
	const margin = 4 * imgMiB
	fill := 3 * per
	all := u2 + 3*per
	post := all + fill
	high := int(math.Round(float64(post-per)*100/float64(capacity))) + 1
	low := int(math.Round(float64(post-9*per/2) * 100 / float64(capacity)))
	trigger, lowBytes := capacity*uint64(high-1)/100, capacity*uint64(low)/100
	t.Logf("disk %d MiB, one image %.1f MiB; high %d%% (over %d MiB), low %d%% (%d MiB)", capacity/imgMiB,
		float64(per)/imgMiB, high, trigger/imgMiB, low, lowBytes/imgMiB)

	a := testenv.StartAgent(t, c, t.TempDir(),
		fmt.Sprintf("--image-gc-high-threshold=%d", high), fmt.Sprintf("--image-gc-low-threshold=%d", low),
		fmt.Sprintf("--minimum-image-ttl-duration=%s", ttl), "--prune-containers=off")
	get := func() (episodeStatus, string) {
		var st episodeStatus
		if code, err := a.Get("/status", &st); err != nil || code != 200 {
			return st, fmt.Sprintf("status: %d %v", code, err)
		}
		if st.ImageGC == nil {
			return st, "no image GC status"
		}
		return st, ""
	}
	status := func() episodeStatus {
		t.Helper()
		st, why := get()
		if why != "" {
			t.Fatal(why)
		}
		return st
	}
	firstSeen := func(st episodeStatus, name string) time.Time {
		for _, img := range st.Images {
			if img.Digest == digest[name] {
				return img.FirstSeen
			}
		}
		return time.Time{}
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		st, why := get()
		if why == "" && (!st.Synced || firstSeen(st, old[0]).IsZero()) {
			why = "not synced"
		}
		return why
	})

	// The young images come 3 s apart, the last just after the old ones
	// come of age: at the crossing they are 3 to 9 s from it.
	// The sleeps are the scenario's timetable, not waits for a result.
	oldAt := firstSeen(status(), old[0]).Add(ttl)
	time.Sleep(time.Until(oldAt.Add(-5 * time.Second)))
	for i, name := range young {
		if i > 0 {
			time.Sleep(3 * time.Second)
		}
		importImage(name)
	}
	var st episodeStatus
	testenv.Eventually(t, 30*time.Second, func() string {
		st = status()
		if firstSeen(st, young[2]).IsZero() {
			return "the last young image is not seen yet"
		}
		if time.Now().Before(oldAt) {
			return "the old images are not of age yet"
		}
		return ""
	})
	_, used := imgDisk(t, c.Root)
	if used+margin > trigger || used+fill < trigger+margin || used+fill-2*per+margin > trigger ||
		used+fill-4*per < lowBytes+margin || used+fill-5*per+margin > lowBytes {
		t.Fatalf("test setup: %d MiB used with the five images (planned %d MiB), fill %d MiB, thresholds over %d MiB / %d MiB leave no margin",
			used/imgMiB, all/imgMiB, fill/imgMiB, trigger/imgMiB, lowBytes/imgMiB)
	}
	if st.ImageGC.Passes != 0 || !st.ImageGC.Episode.IsZero() {
		t.Fatalf("below the high threshold: %d passes, episode %s", st.ImageGC.Passes, st.ImageGC.Episode)
	}

	// The crossing: a file written straight to the image filesystem.
	f, err := os.Create(filepath.Join(c.Root, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(fill)); err != nil {
		t.Fatalf("fallocate the fill: %v", err)
	}
	written := time.Now()
	f.Close()
	crossing := time.Now()
	var first gc.ImagePass
	testenv.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, func() string {
		st := status()
		if st.ImageGC.Passes == 0 || st.ImageGC.LastPass == nil {
			return "no pass since the crossing"
		}
		if st.ImageGC.Passes > 1 {
			t.Fatalf("%d passes before the first was seen: %+v", st.ImageGC.Passes, st.ImageGC.LastPass)
		}
		first = *st.ImageGC.LastPass
		return ""
	})
	if first.Trigger != "disk" || !first.Triggered {
		t.Fatalf("first pass after the crossing: trigger %q, triggered %v", first.Trigger, first.Triggered)
	}
	t.Logf("unannounced crossing (%d MiB fallocated in %s): first pass started %s after the write (%s after it began)",
		fill/imgMiB, written.Sub(began).Round(time.Microsecond), first.Start.Sub(written).Round(time.Millisecond),
		first.Start.Sub(began).Round(time.Millisecond))
	for _, name := range young {
		t.Logf("%s comes of age %s after the crossing", name, firstSeen(st, name).Add(ttl).Sub(crossing).Round(100*time.Millisecond))
	}

	// The episode: every young image goes as it comes of age, until usage
	// is at the low threshold.
	testenv.Eventually(t, 40*time.Second, func() string {
		st = status()
		removed := imgRemoved(t, a)
		if len(removed) < 5 || st.ImageGC.LastPass == nil || !st.ImageGC.LastPass.LowReached {
			return fmt.Sprintf("%d of 5 images removed, usage %d%% (last pass %+v)", len(removed), st.ImageGC.Usage,
				st.ImageGC.LastPass)
		}
		return ""
	})
	ended := time.Since(crossing)
	removed := imgRemoved(t, a)
	if want := []string{digest[young[0]], digest[young[1]], digest[young[2]]}; len(removed) != 5 ||
		!slices.Equal(removed[2:], want) || !slices.Contains(removed[:2], digest[old[0]]) || !slices.Contains(removed[:2], digest[old[1]]) {
		t.Fatalf("removed (in order) %v, want the old two %v, then %v", removed, []string{digest[old[0]], digest[old[1]]}, want)
	}
	triggers, removedBy := episodePasses(t, a)
	for _, name := range old {
		if removedBy[digest[name]] != "disk" {
			t.Errorf("%s removed by a %q pass, want the crossing's (disk)", name, removedBy[digest[name]])
		}
	}
	for _, name := range young {
		if removedBy[digest[name]] != "episode" {
			t.Errorf("%s removed by a %q pass, want one of the episode", name, removedBy[digest[name]])
		}
	}
	if _, used := imgDisk(t, c.Root); used > lowBytes {
		t.Errorf("statfs: %d MiB used, above the low threshold (%d MiB)", used/imgMiB, lowBytes/imgMiB)
	}
	if !st.ImageGC.Episode.IsZero() || st.ImageGC.Above {
		t.Errorf("after the low threshold: episode %s, above high %v", st.ImageGC.Episode, st.ImageGC.Above)
	}
	t.Logf("low threshold reached %s after the crossing; passes: %s", ended.Round(time.Millisecond), strings.Join(triggers, ", "))

	// Later, a change between the thresholds: an image imported, which
	// then comes of age. No episode, no pass.
	passes := st.ImageGC.Passes
	late := "example.test/late:1"
	importImage(late)
	var lateAt time.Time
	testenv.Eventually(t, 30*time.Second, func() string {
		if lateAt = firstSeen(status(), late); lateAt.IsZero() {
			return "the late image is not seen yet"
		}
		return ""
	})
	if u, ok := usageOf(t, c.Root); !ok || u >= high || u <= low {
		t.Fatalf("test setup: usage %d%% after the late image, want between %d%% and %d%%", u, low, high)
	}
	// A change pass would run within a second of the change, a min-age
	// one when the image comes of age: nothing must happen until 2 s past
	// that (a window in which a pass would show, not a wait for a result).
	time.Sleep(time.Until(lateAt.Add(ttl + 2*time.Second)))
	if st := status(); st.ImageGC.Passes != passes || !st.ImageGC.Episode.IsZero() {
		t.Fatalf("between the thresholds after the episode: %d passes (was %d), episode %s, last %+v",
			st.ImageGC.Passes, passes, st.ImageGC.Episode, st.ImageGC.LastPass)
	}
	if imageGone(t, c, late) {
		t.Fatalf("the late image was removed below the high threshold")
	}
}

// usageOf is the kubelet's usage of dir's filesystem, rounded up; ok is
// false for a zero capacity.
func usageOf(t *testing.T, dir string) (int, bool) {
	capacity, used := imgDisk(t, dir)
	if capacity == 0 {
		return 0, false
	}
	return 100 - int((capacity-used)*100/capacity), true
}
