package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// treeHash maps every path under root (root included) to a description of
// what lstat sees there: type, mode, size and content hash of regular files,
// target of symlinks. It never follows a symlink; it does descend into
// mount points, so a mount's content is covered too.
func treeHash(t testing.TB, roots ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := os.Lstat(p)
			if err != nil {
				return err
			}
			desc := fmt.Sprintf("%s %o", info.Mode().Type(), info.Mode().Perm())
			switch {
			case info.Mode().IsRegular():
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(b)
				desc += fmt.Sprintf(" %d %s", len(b), hex.EncodeToString(sum[:8]))
			case info.Mode().Type() == fs.ModeSymlink:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				desc += " -> " + target
			}
			out[p] = desc
			return nil
		})
		if err != nil {
			t.Fatalf("hash %s: %v", root, err)
		}
	}
	return out
}

// hashesWithout returns h minus the paths at or under any of gone.
func hashesWithout(h map[string]string, gone ...string) map[string]string {
	out := map[string]string{}
	for p, d := range h {
		drop := false
		for _, g := range gone {
			if p == g || strings.HasPrefix(p, g+"/") {
				drop = true
			}
		}
		if !drop {
			out[p] = d
		}
	}
	return out
}

func diffHashes(got, want map[string]string) string {
	var lines []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			lines = append(lines, fmt.Sprintf("missing %q (%s)", p, w))
		} else if g != w {
			lines = append(lines, fmt.Sprintf("changed %q: %s, was %s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			lines = append(lines, fmt.Sprintf("unexpected %q (%s)", p, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func mustWrite(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t testing.TB, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// bindMount mounts src on dst and unmounts it when the test ends (before
// testenv removes the daemon's directory).
func bindMount(t testing.TB, src, dst string) {
	t.Helper()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s on %s: %v", src, dst, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dst, err)
		}
	})
}

// TestLogsHostileTrees: with the agent running, LogDir and PodLogDir hold a
// kubelet-made tree plus hostile entries. Only the dangling links of exited
// and removed containers and the orphaned, unmounted pod dirs go; every
// other byte, in and outside the directories, stays as it was.
func TestLogsHostileTrees(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		outside := t.TempDir() // another temp dir: links point here, a mount comes from here
		mustWrite(t, filepath.Join(outside, "secret.log"), "do not touch\n")
		mustWrite(t, filepath.Join(outside, "podlike", "keep.txt"), "nor this\n")
		mustWrite(t, filepath.Join(outside, "mounted", "data.log"), "mounted data\n")
		// Container removal is off: only the log cleaner acts.
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--prune-containers=off", "--pod-log-grace=2s")
		waitSynced(t, a)

		// A live pod made like a kubelet: its running container's link has a
		// target; its exited container's link dangles once the kubelet has
		// removed that log (rotation, or the container's log cleanup).
		live := c.RunPod(t, rt, "live", "default", "5c1f0a9e-live")
		server := c.RunPodContainerAttempt(t, rt, live, "server", 0, gcImage, "sleep", "600")
		job := c.RunPodContainerAttempt(t, rt, live, "job", 0, gcImage, "sh", "-c", "echo done")
		waitCRIExited(t, c, rt, job)
		jobLink := filepath.Join(c.LogDir, fmt.Sprintf("live_default_job-%s.log", job))
		// Also linked under a hostile name (space, invalid UTF-8).
		oddJobLink := filepath.Join(c.LogDir, fmt.Sprintf("li ve\xff_default_job-%s.log", job))
		mustSymlink(t, filepath.Join(live.LogDir, "job", "0.log"), oddJobLink)
		// A running container whose log is gone (rotation window): kept.
		serverLog := filepath.Join(live.LogDir, "server", "0.log")

		// A pod that ran and is gone: the kubelet removed its containers and
		// sandbox, not its log dir; its links dangle once that dir goes.
		gone := c.RunPod(t, rt, "gone", "default", "9e4b2d70-gone")
		goneCtr := c.RunPodContainerAttempt(t, rt, gone, "app", 0, gcImage, "true")
		waitCRIExited(t, c, rt, goneCtr)
		ctx := c.Ctx()
		if _, err := rt.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: goneCtr}); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: gone.SandboxID}); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: gone.SandboxID}); err != nil {
			t.Fatal(err)
		}
		goneLink := filepath.Join(c.LogDir, fmt.Sprintf("gone_default_app-%s.log", goneCtr))

		// Hostile entries in LogDir.
		L := func(name string) string { return filepath.Join(c.LogDir, name) }
		mustSymlink(t, filepath.Join(outside, "secret.log"), L("ext_default_x-0123456789ab.log")) // target outside, exists
		mustSymlink(t, L("loop_default_b-bbbbbbbbbbbb.log"), L("loop_default_a-aaaaaaaaaaaa.log"))
		mustSymlink(t, L("loop_default_a-aaaaaaaaaaaa.log"), L("loop_default_b-bbbbbbbbbbbb.log"))
		mustWrite(t, L("plain_default_c-cccccccccccc.log"), "a regular file, not a link\n")
		mustWrite(t, L("sp ace \xfe\xff_default_c-dddddddddddd.log"), "regular, odd name\n")
		mustSymlink(t, filepath.Join(outside, "secret.log"), L("odd \xc3\x28 name_default_y-eeeeeeeeeeee.log"))
		mustSymlink(t, filepath.Join(outside, "podlike"), L("dir_default_z-ffffffffffff.log")) // link to a dir outside
		mustWrite(t, L("notes.txt"), "not a log\n")

		// Hostile entries in PodLogDir.
		P := func(name string) string { return filepath.Join(c.PodLogDir, name) }
		orphan := P("default_orphan_3f9a0c11-orphan")
		mustWrite(t, filepath.Join(orphan, "app", "0.log"), "orphan log\n")
		oddOrphan := P("we ird\xff_na me_77aa88bb-odd")
		mustWrite(t, filepath.Join(oddOrphan, "c", "0.log"), "odd orphan\n")
		mounted := P("default_mounted_44d2e0f1-mnt")
		if err := os.MkdirAll(filepath.Join(mounted, "vol"), 0o755); err != nil {
			t.Fatal(err)
		}
		bindMount(t, filepath.Join(outside, "mounted"), filepath.Join(mounted, "vol"))
		mustSymlink(t, filepath.Join(outside, "podlike"), P("default_linked_5e5e5e5e-lnk")) // a link named like a pod
		mustWrite(t, P("default_file_6f6f6f6f-file"), "a file named like a pod\n")
		mustWrite(t, filepath.Join(c.PodLogDir, "lost+found", "x"), "not a pod\n")

		before := treeHash(t, c.LogDir, c.PodLogDir, outside)
		// The kubelet removed the exited job's log; the running server's log
		// is gone too (rotation): only the job's links may go for it.
		for _, p := range []string{filepath.Join(live.LogDir, "job", "0.log"), serverLog} {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		goneDir := gone.LogDir
		removed := []string{jobLink, oddJobLink, goneLink, goneDir, orphan, oddOrphan,
			filepath.Join(live.LogDir, "job", "0.log"), serverLog}

		testenv.Eventually(t, 20*time.Second, func() string {
			var still []string
			for _, p := range removed {
				if _, err := os.Lstat(p); err == nil {
					still = append(still, p)
				}
			}
			if len(still) > 0 {
				return fmt.Sprintf("still there: %q", still)
			}
			return ""
		})
		// The tree settles: one more pass after the last removal changes nothing.
		want := hashesWithout(before, removed...)
		testenv.Eventually(t, 5*time.Second, func() string {
			return diffHashes(treeHash(t, c.LogDir, c.PodLogDir, outside), want)
		})
		for _, p := range []string{filepath.Join(c.LogDir, fmt.Sprintf("live_default_server-%s.log", server)), live.LogDir, mounted} {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		m := mustMetrics(t, a)
		for _, want := range []string{
			`gcagent_logs_removed_total{kind="symlink",reason="container-exited"} 2`,
			`gcagent_logs_removed_total{kind="symlink",reason="container-unknown"} 1`,
			`gcagent_logs_removed_total{kind="poddir",reason="pod-gone"} 1`,
			`gcagent_logs_removed_total{kind="poddir",reason="pod-unknown"} 2`,
		} {
			if !containsLine(m, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
		if t.Failed() {
			var lines []string
			for _, l := range strings.Split(m, "\n") {
				if strings.HasPrefix(l, "gcagent_logs_") {
					lines = append(lines, l)
				}
			}
			slices.Sort(lines)
			t.Logf("log metrics:\n%s", strings.Join(lines, "\n"))
		}
	})
}

// TestLogsOffWithoutCRINamespace: an agent that does not manage CRI's
// namespace (here: it follows another one) cannot tell the kubelet's live
// logs from dead ones, so it removes nothing from the log dirs, not even
// an orphan past its grace, and says why. (That CRI must agree before a pod
// dir the projection does not see goes is TestPodStateConfirmsWithCRI.)
func TestLogsOffWithoutCRINamespace(t *testing.T) {
	t.Parallel()
	c := testenv.StartContainerd(t, testenv.Options{Version: testenv.Versions()[0]})
	c.Import(t, testenv.Pause(c.SandboxImage))
	rt, _ := c.CRI(t)
	pod := c.RunPod(t, rt, "web", "default", "8c0ffee0-live-web")
	orphan := filepath.Join(c.PodLogDir, "default_ghost_8c0ffee0-gone-ghost")
	if err := os.MkdirAll(filepath.Join(orphan, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--namespace=elsewhere", "--pod-log-grace=1s",
		"--prune-containers=off", "--image-gc-high-threshold=100")
	waitSynced(t, a)
	testenv.Eventually(t, 10*time.Second, func() string {
		if b, _ := os.ReadFile(a.LogFile); !strings.Contains(string(b), "log cleanup off") {
			return "the agent does not say that log cleanup is off"
		}
		return ""
	})
	time.Sleep(3 * time.Second) // three graces: a cleaner that ran would have removed the orphan
	for _, dir := range []string{orphan, pod.LogDir} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s removed by an agent that does not manage %s: %v", dir, testenv.Namespace, err)
		}
	}
}

// TestLogsDeepRemovalAndBlindPodDir: a link whose target is removed deep
// inside a pod's container log dir, with no container event, is gone within
// a second (the pod and container dirs are watched); an agent whose
// --pod-log-dir is missing while CRI containers run removes no link (every
// link would look dangling to it).
func TestLogsDeepRemovalAndBlindPodDir(t *testing.T) {
	// Not parallel: it asserts a link goes within a second of its target,
	// which a machine busy with other tests' imports may miss.
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		rt, _ := c.CRI(t)
		c.Import(t, testenv.Runnable(gcImage), testenv.Pause(c.SandboxImage))
		pod := c.RunPod(t, rt, "deep", "default", "6d1e2f3a-deep")
		c.RunPodContainerAttempt(t, rt, pod, "server", 0, gcImage, "sleep", "600")
		job := c.RunPodContainerAttempt(t, rt, pod, "job", 0, gcImage, "sh", "-c", "echo done")
		waitCRIExited(t, c, rt, job)
		link := filepath.Join(c.LogDir, fmt.Sprintf("deep_default_job-%s.log", job))

		// The blind agent first: its pod log dir does not exist.
		blind := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "blind"), "--prune-containers=off",
			"--pod-log-dir", filepath.Join(t.TempDir(), "missing"))
		waitSynced(t, blind)
		if err := os.Remove(filepath.Join(pod.LogDir, "job", "0.log")); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() string {
			b, _ := os.ReadFile(blind.LogFile)
			if !strings.Contains(string(b), `"reason":"no-pod-log-dir"`) && !strings.Contains(string(b), "no-pod-log-dir") {
				var st struct {
					Logs struct {
						Decisions []struct{ Name, Reason string } `json:"decisions"`
					} `json:"logs"`
				}
				if _, err := blind.Get("/status", &st); err == nil {
					for _, d := range st.Logs.Decisions {
						if strings.Contains(d.Name, job) && d.Reason == "no-pod-log-dir" {
							return ""
						}
					}
				}
				return "the blind agent has not planned the dangling link yet"
			}
			return ""
		})
		if _, err := os.Lstat(link); err != nil {
			t.Fatalf("the blind agent removed %s: %v", link, err)
		}
		blind.Stop()

		// Restore the log, start the right agent, then remove the log again
		// with no container event: the link goes within a second.
		mustWrite(t, filepath.Join(pod.LogDir, "job", "0.log"), "done\n")
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--prune-containers=off")
		waitSynced(t, a)
		jobDir := filepath.Join(pod.LogDir, "job")
		testenv.Eventually(t, 10*time.Second, func() string {
			b, _ := os.ReadFile(a.LogFile)
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, `"path":"`+jobDir+`"`) && strings.Contains(line, `"message":"watching"`) {
					return ""
				}
			}
			return "not watching " + jobDir + " yet"
		})
		removed := time.Now()
		if err := os.Remove(filepath.Join(pod.LogDir, "job", "0.log")); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() string {
			if _, err := os.Lstat(link); err == nil {
				return "link still there"
			}
			return ""
		})
		if took := time.Since(removed); took > time.Second {
			t.Errorf("link removed %s after its target, want within 1s (no container event; the floor sweep is 1m)", took)
		} else {
			t.Logf("link removed %s after its target", took.Round(time.Millisecond))
		}
	})
}
