package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestNamespaces: one agent with --namespace=* manages every namespace of
// the node but Docker's. Containers are pruned in each namespace (one
// created after the agent started included); images are deleted in one
// least-recently-used order over all namespaces; an image is held only by
// containers of its own namespace (the same image in default goes while
// k8s.io's copy runs); moby is never touched. The LRU history of every
// namespace survives a restart of the agent.
func TestNamespaces(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) { t.Parallel(); testNamespaces(t, v) })
	}
}

func testNamespaces(t *testing.T, v testenv.Version) {
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "400m"})
	layer := func(seed string) testenv.Layer { return testenv.Layer{Seed: seed, Size: 2 * imgMiB} }
	in := func(ns string) *testenv.Containerd { return c.InNamespace(ns) }
	// The same image (same digest) in k8s.io and default.
	shared := testenv.Runnable("example.test/shared:1", layer("shared"))
	in("k8s.io").Import(t, shared, testenv.Runnable("example.test/kube-a:1", layer("kube-a")))
	in("default").Import(t, shared, testenv.Runnable("example.test/def-a:1", layer("def-a")),
		testenv.Runnable("example.test/def-run:1", layer("def-run")))
	in("buildkit").Import(t, testenv.Runnable("example.test/bk-a:1", layer("bk-a")))
	in("moby").Import(t, testenv.Runnable("example.test/moby-a:1", layer("moby-a")))
	in("k8s.io").RunNative(t, "ns-shared-run", "example.test/shared:1", "sleep", "600")
	in("default").RunNative(t, "ns-def-run", "example.test/def-run:1", "sleep", "600")

	state := t.TempDir()
	// Phase 1: image GC off (high 100), plain containers pruned a second
	// after they exit.
	a := testenv.StartAgent(t, c, state, "--namespace=*", "--image-gc-high-threshold=100",
		"--uncollected-exit-grace=1s", "--minimum-container-ttl-duration=0s")
	waitSynced(t, a)
	images := func() map[string]imgReportLite {
		var st struct {
			Namespaces []string        `json:"namespaces"`
			Images     []imgReportLite `json:"images"`
		}
		if code, err := a.Get("/status", &st); err != nil || code != 200 {
			t.Fatalf("status: %d %v", code, err)
		}
		out := map[string]imgReportLite{}
		for _, img := range st.Images {
			for _, n := range img.Names {
				out[img.Namespace+"/"+n] = img
			}
		}
		return out
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		got := images()
		for _, want := range []string{"k8s.io/example.test/shared:1", "default/example.test/shared:1", "default/example.test/def-a:1",
			"buildkit/example.test/bk-a:1", "k8s.io/example.test/kube-a:1"} {
			if _, ok := got[want]; !ok {
				return "not in /status yet: " + want
			}
		}
		for name := range got {
			if strings.HasPrefix(name, "moby/") {
				return "an excluded namespace is projected: " + name
			}
		}
		return ""
	})

	// A namespace created after the agent started: containerd creates it
	// with its first object, and no /namespaces/create is published.
	in("late").Import(t, testenv.Runnable("example.test/late-a:1", layer("late-a")))
	testenv.Eventually(t, 30*time.Second, func() string {
		if _, ok := images()["late/example.test/late-a:1"]; !ok {
			return "namespace late not followed yet"
		}
		return ""
	})

	// Last use, oldest first, across namespaces: each image runs a
	// container that exits and is left to the agent, which prunes it in
	// its own namespace; the image's last use is then.
	lru := []struct{ ns, image, id string }{
		{"default", "example.test/def-a:1", "ns-def-a"},
		{"buildkit", "example.test/bk-a:1", "ns-bk-a"},
		{"k8s.io", "example.test/kube-a:1", "ns-kube-a"},
		{"late", "example.test/late-a:1", "ns-late-a"},
	}
	for _, u := range lru {
		ctr := in(u.ns).RunNative(t, u.id, u.image, "true")
		in(u.ns).WaitExit(t, ctr)
		testenv.Eventually(t, 30*time.Second, func() string {
			for _, l := range imgAgentLog(t, a, "containergc") {
				if l.Message == "removed" && l.Container == u.id {
					if l.Namespace != u.ns {
						t.Fatalf("container %s removed in namespace %q, want %q", u.id, l.Namespace, u.ns)
					}
					return ""
				}
			}
			return "container " + u.ns + "/" + u.id + " not pruned yet"
		})
		if _, err := in(u.ns).Client.LoadContainer(in(u.ns).Ctx(), u.id); err == nil {
			t.Fatalf("container %s/%s still in containerd after its removal was logged", u.ns, u.id)
		}
		testenv.Eventually(t, 30*time.Second, func() string {
			if img := images()[u.ns+"/"+u.image]; img.LastUsed.IsZero() || len(img.Users) > 0 {
				return u.ns + "/" + u.image + ": last use not seen yet"
			}
			return ""
		})
	}
	a.Stop()

	// Phase 2, after a restart on the same state: image GC with nothing to
	// keep free (low 0) deletes every eligible image, so the order of the
	// removals is the LRU over every namespace: never used first (default's
	// copy of shared, which k8s.io's running container does not hold),
	// then by last use.
	a = testenv.StartAgent(t, c, state, "--namespace=*", "--image-gc-high-threshold=1", "--image-gc-low-threshold=0",
		"--minimum-image-ttl-duration=1s", "--prune-containers=off")
	want := []string{"default/example.test/shared:1"}
	for _, u := range lru {
		want = append(want, u.ns+"/"+u.image)
	}
	var removed []string
	testenv.Eventually(t, 60*time.Second, func() string {
		removed = removed[:0]
		for _, l := range imgAgentLog(t, a, "imagegc") {
			if l.Message == "image removed" {
				removed = append(removed, l.Namespace+"/"+l.Image)
			}
		}
		if len(removed) < len(want) {
			return fmt.Sprintf("removed %v so far, want %v", removed, want)
		}
		return ""
	})
	if !slices.Equal(removed, want) {
		t.Fatalf("removed, in order, %v; want the LRU over every namespace %v", removed, want)
	}
	// What no rule allowed is there still, in its own namespace.
	for _, keep := range []struct{ ns, image string }{
		{"k8s.io", "example.test/shared:1"},   // a running container of k8s.io
		{"default", "example.test/def-run:1"}, // a running container of default
		{"moby", "example.test/moby-a:1"},     // an excluded namespace
	} {
		if _, err := in(keep.ns).Client.ImageService().Get(in(keep.ns).Ctx(), keep.image); err != nil {
			t.Errorf("%s/%s: %v (must be kept)", keep.ns, keep.image, err)
		}
	}
	for _, gone := range want {
		ns, name, _ := strings.Cut(gone, "/")
		if _, err := in(ns).Client.ImageService().Get(in(ns).Ctx(), name); err == nil {
			t.Errorf("%s logged as removed but still in containerd", gone)
		}
	}
	metrics, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"default", "buildkit", "late"} {
		if !strings.Contains(metrics, `gcagent_image_gc_images_removed_total{namespace="`+ns+`",reason="space"}`) {
			t.Errorf("no removal counted for namespace %s in /metrics", ns)
		}
	}
	if strings.Contains(metrics, `namespace="moby"`) {
		t.Errorf("/metrics has a series of the excluded namespace moby")
	}
}

// imgReportLite is an image of /status as this test reads it.
type imgReportLite struct {
	Namespace string    `json:"namespace"`
	Digest    string    `json:"digest"`
	Names     []string  `json:"names"`
	LastUsed  time.Time `json:"lastUsed"`
	Users     []string  `json:"users"`
}
