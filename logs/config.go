package logs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Config configures the Cleaner.
type Config struct {
	// LogDir holds the kubelet's <pod>_<namespace>_<container>-<id>.log
	// symlinks. Default /var/log/containers.
	LogDir string
	// PodLogDir holds the pod log directories <namespace>_<name>_<uid>.
	// Default /var/log/pods.
	PodLogDir string
	// HostPodLogDir is the pod log dir's path on the host, which the
	// kubelet's link targets start with, when the agent sees that dir at
	// PodLogDir instead (a DaemonSet mounting it elsewhere, k3s, RKE2, a
	// custom podLogsDir): a target under it is looked up under PodLogDir.
	// Default empty: the same as PodLogDir.
	HostPodLogDir string
	// PodLogGrace is how long a pod log dir outlives the last sandbox of its
	// uid; for a uid the projection never knew (and for a dangling link of a
	// container it does not know) it counts from when the agent first saw
	// the entry. Default 1m.
	PodLogGrace time.Duration
	// DryRun plans, logs and publishes, and deletes nothing. Default false.
	DryRun bool
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{LogDir: "/var/log/containers", PodLogDir: "/var/log/pods", PodLogGrace: time.Minute}
}

// Validate reports the first invalid field: directories must be absolute,
// clean and disjoint (neither inside the other, or one would be cleaned as
// an entry of the other), and the grace not negative.
func (c Config) Validate() error {
	for _, d := range []struct{ flag, path string }{{"log-dir", c.LogDir}, {"pod-log-dir", c.PodLogDir}} {
		if !filepath.IsAbs(d.path) || filepath.Clean(d.path) != d.path {
			return fmt.Errorf("--%s %q: must be an absolute, clean path", d.flag, d.path)
		}
	}
	if h := c.HostPodLogDir; h != "" && (!filepath.IsAbs(h) || filepath.Clean(h) != h || h == "/") {
		return fmt.Errorf("--host-pod-log-dir %q: must be an absolute, clean path other than /", h)
	}
	if within(c.LogDir, c.PodLogDir) || within(c.PodLogDir, c.LogDir) {
		return fmt.Errorf("--log-dir %q and --pod-log-dir %q must not be the same or nested", c.LogDir, c.PodLogDir)
	}
	if c.PodLogGrace < 0 {
		return errors.New("--pod-log-grace: must not be negative")
	}
	return nil
}

// TargetInView says where the agent sees the target of a link of LogDir,
// so that a failed stat there is evidence the target is gone: an absolute
// target under the host's pod log dir (HostPodLogDir, else PodLogDir) has
// that prefix replaced by PodLogDir; a relative one is resolved from LogDir
// as the kernel does, only while the agent sees the host's paths
// (HostPodLogDir unset or PodLogDir). ok is false for any other target:
// it lies outside the pod log dir the agent sees, and a stat that fails
// there says nothing of the host's file. It does no I/O.
func (c Config) TargetInView(target string) (path string, ok bool) {
	host := c.HostPodLogDir
	if host == "" {
		host = c.PodLogDir
	}
	if !filepath.IsAbs(target) {
		if host != c.PodLogDir {
			return "", false
		}
		target = filepath.Join(c.LogDir, target)
	}
	target = filepath.Clean(target)
	if !within(target, host) || target == host {
		return "", false
	}
	return c.PodLogDir + strings.TrimPrefix(target, host), true
}

// within reports whether path is dir or lies under it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}
