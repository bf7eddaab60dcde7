package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The host paths a kubelet writes whatever its flags say: the legacy log
// links (kubelet.go's DefaultContainerLogsDir) and the device plugins'
// socket dir (the device manager's pluginapi.DevicePluginPath).
const (
	hostLogLinkDir    = "/var/log/containers"
	hostKubeletDir    = "/var/lib/kubelet"
	hostDevicePlugins = "/var/lib/kubelet/device-plugins"
)

// kubeletLock serialises kubelets across test processes (every package's
// test binary, every worktree on the machine): a flock, which also
// excludes a second holder in the same process.
const kubeletLock = "/tmp/gcagent-test-kubelet.lock"

// lockKubelet waits until no other test runs a kubelet and returns the
// release.
func lockKubelet(t testing.TB) func() {
	t.Helper()
	f, err := os.OpenFile(kubeletLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(kubeletLock)
		t.Logf("waiting for the kubelet of another test (%s: %s)", kubeletLock, strings.TrimSpace(string(holder)))
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			t.Fatalf("lock %s: %v", kubeletLock, err)
		}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+" "+t.Name()+"\n"), 0)
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}
}

// hostState is what a kubelet may change on the host, as it was before.
type hostState struct {
	// before lists hostLogLinkDir, hostKubeletDir and hostDevicePlugins
	// (nil: absent).
	before map[string][]string
	// madeShared: "/" was private and StartKubelet made it rshared, as
	// systemd has it on a node (mountPropagation HostToContainer needs a
	// shared or slave source); restore makes it private again.
	madeShared bool
}

var hostDirs = []string{hostLogLinkDir, hostKubeletDir, hostDevicePlugins}

// listDir returns the names in dir, nil if it is absent.
func listDir(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	names := []string{}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func saveHost(t testing.TB) *hostState {
	t.Helper()
	h := &hostState{before: map[string][]string{}}
	for _, d := range hostDirs {
		h.before[d] = listDir(d)
	}
	if !anyPropagation() {
		if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			t.Fatalf("mount --make-rshared /: %v", err)
		}
		h.madeShared = true
	}
	return h
}

// anyPropagation reports whether any mount of this namespace is shared or
// a slave (then "/" is left as it is).
func anyPropagation() bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return true
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Optional fields sit between the mount options (field 6) and "-".
		fields := strings.Fields(sc.Text())
		for _, fl := range fields[min(6, len(fields)):] {
			if fl == "-" {
				break
			}
			if strings.HasPrefix(fl, "shared:") || strings.HasPrefix(fl, "master:") {
				return true
			}
		}
	}
	return false
}

// restore puts the host back, still under the lock: the log links the
// kubelet made for pods in podLogDir go, and the dirs that were not there
// before; then each dir must list what it did before, or the test fails.
func (h *hostState) restore(t testing.TB, podLogDir string) {
	t.Helper()
	had := func(dir, name string) bool { return slices.Contains(h.before[dir], name) }
	for _, name := range listDir(hostLogLinkDir) {
		p := filepath.Join(hostLogLinkDir, name)
		if target, err := os.Readlink(p); err == nil && !had(hostLogLinkDir, name) && strings.HasPrefix(target, podLogDir+"/") {
			if err := os.Remove(p); err != nil {
				t.Errorf("remove the kubelet's log link %s: %v", p, err)
			}
		}
	}
	if h.before[hostDevicePlugins] == nil {
		if err := os.RemoveAll(hostDevicePlugins); err != nil {
			t.Errorf("remove %s: %v", hostDevicePlugins, err)
		}
	}
	for _, d := range []string{hostLogLinkDir, hostKubeletDir} {
		if h.before[d] == nil {
			_ = os.Remove(d) // only if empty
		}
	}
	for _, d := range hostDirs {
		if now := listDir(d); !slices.Equal(now, h.before[d]) {
			t.Errorf("%s after the kubelet: %s; before: %s", d, describe(now), describe(h.before[d]))
		}
	}
	if h.madeShared {
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			t.Errorf("mount --make-rprivate /: %v", err)
		}
	}
}

func describe(names []string) string {
	if names == nil {
		return "absent"
	}
	return fmt.Sprint(names)
}

// removeCgroups removes root (a cgroupfs path) and everything below it in
// every cgroup hierarchy, deepest first, waiting a little for cgroups that
// still have a process leaving.
func removeCgroups(t testing.TB, root string) {
	hier, _ := filepath.Glob("/sys/fs/cgroup/*") // v1 (and hybrid) hierarchies
	var dirs []string
	for _, h := range append(hier, "/sys/fs/cgroup") { // v2
		base := filepath.Join(h, root)
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	deadline := time.Now().Add(20 * time.Second)
	for _, d := range dirs {
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("remove cgroup %s: %v", d, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
