package testenv

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// KubeletVersion is the kubelet release `make deps` builds (from the
// module in internal/testenv/k8sbuild).
const KubeletVersion = "v1.37.2"

// KubeletPath returns the kubelet `make deps` built (GCAGENT_TEST_KUBELET_DIR,
// else its cache dir); a missing one fails the test under CI=true and skips
// it elsewhere.
func KubeletPath(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("GCAGENT_TEST_KUBELET_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gcagent", "kubelet-"+KubeletVersion)
	}
	bin := filepath.Join(dir, "kubelet")
	_, err := os.Stat(bin)
	Require(t, err == nil, "kubelet "+KubeletVersion+" ("+bin+")")
	return bin
}

// KubeletOptions configures StartKubelet. A zero field is the kubelet's
// own default unless it says otherwise.
type KubeletOptions struct {
	// NodeName is --hostname-override; default DefaultNodeName.
	NodeName string
	// SyncFrequency is syncFrequency (kubelet default 1m): how long a
	// pod's status may lag behind its containers.
	SyncFrequency time.Duration
	// ImageGCHighThresholdPercent and ImageGCLowThresholdPercent are the
	// kubelet's image GC thresholds (kubelet default 85 and 80; a high
	// threshold of 100 turns its image GC off).
	ImageGCHighThresholdPercent, ImageGCLowThresholdPercent int32
	// ImageMinimumGCAge and ImageMaximumGCAge (kubelet default 2m and
	// none).
	ImageMinimumGCAge, ImageMaximumGCAge time.Duration
	// Verbosity is --v; default 2.
	Verbosity int
	// Edit, if set, changes the configuration last, before it is written:
	// for any field above does not name. Eviction is off by default (its
	// image GC under disk pressure would race the tests that make
	// pressure): Edit can set EvictionHard.
	Edit func(*kubeletv1beta1.KubeletConfiguration)
}

// DefaultNodeName is the node name of a test kubelet: a static pod's name
// as the kubelet reports it is the manifest's name, "-", and the node name.
const DefaultNodeName = "gcagent-node"

// Kubelet is a running standalone kubelet (no API server: static pods
// only) on a private containerd.
type Kubelet struct {
	Containerd *Containerd
	NodeName   string
	// Dir holds everything of this kubelet but its pods' logs, which are
	// in Containerd.PodLogDir (podLogsDir).
	Dir string
	// RootDir is --root-dir, the kubelet's /var/lib/kubelet.
	RootDir string
	// ConfigPath is the KubeletConfiguration file (in RootDir, as kubeadm
	// puts it). Tests may rewrite it (EditConfig) and Restart.
	ConfigPath string
	// StaticPodDir is staticPodPath (PutStaticPod writes there).
	StaticPodDir string
	// CgroupRoot is cgroupRoot (cgroupfs): the pods' cgroups are below it
	// in every hierarchy.
	CgroupRoot string
	// Addr is the kubelet's API (HTTPS, loopback): /pods, /containerLogs.
	Addr string
	// HealthzAddr serves /healthz (HTTP, loopback).
	HealthzAddr string
	LogFile     string

	t      testing.TB
	bin    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
	http   *http.Client
}

// StartKubelet starts a standalone kubelet on c, with c's socket as its
// container runtime and c.PodLogDir as its podLogsDir, and waits until its
// API answers. It imports c's sandbox image (built here; there is no
// registry). Only one kubelet runs at a time on the machine (it writes
// /var/log/containers and /var/lib/kubelet/device-plugins, fixed paths):
// StartKubelet waits for the one running in another test or process to
// end. When the test ends, the kubelet is stopped, then its pods' tasks are
// killed, then (with the daemon) their cgroups removed, and the host paths
// it wrote are as they were before.
func StartKubelet(t testing.TB, c *Containerd, opts KubeletOptions) *Kubelet {
	t.Helper()
	bin := KubeletPath(t)
	if os.Geteuid() != 0 {
		Require(t, false, "root (the kubelet needs it)")
	}
	c.Import(t, Pause(c.SandboxImage))
	// Cleanups run last first: the kubelet's, then the host's, then the lock.
	t.Cleanup(lockKubelet(t))
	host := saveHost(t)
	t.Cleanup(func() { host.restore(t, c.PodLogDir) })
	dir, err := os.MkdirTemp("", "gcak-")
	if err != nil {
		t.Fatal(err)
	}
	if opts.NodeName == "" {
		opts.NodeName = DefaultNodeName
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 2
	}
	k := &Kubelet{
		Containerd:   c,
		NodeName:     opts.NodeName,
		Dir:          dir,
		RootDir:      filepath.Join(dir, "lib"),
		StaticPodDir: filepath.Join(dir, "manifests"),
		CgroupRoot:   "/" + filepath.Base(dir),
		Addr:         FreeAddr(t),
		HealthzAddr:  FreeAddr(t),
		LogFile:      filepath.Join(dir, "kubelet.log"),
		t:            t,
		bin:          bin,
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			// The kubelet's self-signed certificate, on loopback.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		}},
	}
	k.ConfigPath = filepath.Join(k.RootDir, "config.yaml")
	for k.HealthzAddr == k.Addr { // each port was free, but the same one
		k.HealthzAddr = FreeAddr(t)
	}
	t.Cleanup(k.cleanup)
	// The daemon's test reports: it may outlive this one.
	c.afterStop = append(c.afterStop, func() { removeCgroups(c.t, k.CgroupRoot) })
	for _, d := range []string{k.RootDir, k.StaticPodDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k.WriteConfig(t, k.config(opts))
	k.args = []string{
		"--config", k.ConfigPath,
		"--root-dir", k.RootDir,
		"--cert-dir", filepath.Join(k.RootDir, "pki"),
		"--hostname-override", k.NodeName,
		"--v", strconv.Itoa(opts.Verbosity),
	}
	k.Start()
	return k
}

// config is the KubeletConfiguration this machine needs (FIELD-2026.md
// §8): cgroup v1, swap, no QoS cgroups, no API server.
func (k *Kubelet) config(opts KubeletOptions) *kubeletv1beta1.KubeletConfiguration {
	host, port := splitAddr(k.t, k.Addr)
	hhost, hport := splitAddr(k.t, k.HealthzAddr)
	yes, no := true, false
	cfg := &kubeletv1beta1.KubeletConfiguration{
		TypeMeta:                 metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		ContainerRuntimeEndpoint: "unix://" + k.Containerd.Address,
		StaticPodPath:            k.StaticPodDir,
		PodLogsDir:               k.Containerd.PodLogDir,
		VolumePluginDir:          filepath.Join(k.Dir, "volume-plugins"),
		Address:                  host,
		Port:                     port,
		HealthzBindAddress:       hhost,
		HealthzPort:              &hport,
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: &yes},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: &no},
		},
		Authorization: kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		RegisterNode:  &no,
		FailSwapOn:    &no,
		FailCgroupV1:  &no, // 1.35+ refuses cgroup v1 otherwise
		CgroupDriver:  "cgroupfs",
		CgroupsPerQOS: &no,
		CgroupRoot:    k.CgroupRoot,
		// "none": an empty list is omitted from the file and defaults to
		// ["pods"], which needs cgroupsPerQOS.
		EnforceNodeAllocatable: []string{"none"},
		// The kubelet ignores a 0% threshold: a map that is not empty keeps
		// the default thresholds out, so nothing is evicted.
		EvictionHard:                map[string]string{"memory.available": "0%"},
		SyncFrequency:               metav1.Duration{Duration: opts.SyncFrequency},
		ImageMinimumGCAge:           metav1.Duration{Duration: opts.ImageMinimumGCAge},
		ImageMaximumGCAge:           metav1.Duration{Duration: opts.ImageMaximumGCAge},
		ImageGCHighThresholdPercent: nonZero(opts.ImageGCHighThresholdPercent),
		ImageGCLowThresholdPercent:  nonZero(opts.ImageGCLowThresholdPercent),
	}
	if opts.Edit != nil {
		opts.Edit(cfg)
	}
	return cfg
}

func nonZero(n int32) *int32 {
	if n == 0 {
		return nil
	}
	return &n
}

func splitAddr(t testing.TB, addr string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return h, int32(n)
}

// Config reads the kubelet's configuration file as it is now.
func (k *Kubelet) Config(t testing.TB) *kubeletv1beta1.KubeletConfiguration {
	t.Helper()
	b, err := os.ReadFile(k.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("%s: %v", k.ConfigPath, err)
	}
	return &cfg
}

// Configz returns the configuration the running kubelet uses, defaults
// filled in (its /configz).
func (k *Kubelet) Configz(t testing.TB) *kubeletv1beta1.KubeletConfiguration {
	t.Helper()
	code, b, err := k.Get("/configz")
	if err != nil || code != http.StatusOK {
		t.Fatalf("kubelet /configz: %d %v %.200s", code, err, b)
	}
	var cz struct {
		Config kubeletv1beta1.KubeletConfiguration `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(b, &cz); err != nil {
		t.Fatalf("kubelet /configz: %v", err)
	}
	return &cz.Config
}

// WriteConfig replaces the configuration file with cfg as editors, kubeadm
// and configuration management do: a new file renamed over the old one (a
// new inode). The running kubelet reads it at its next (Re)start.
func (k *Kubelet) WriteConfig(t testing.TB, cfg *kubeletv1beta1.KubeletConfiguration) {
	t.Helper()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	writeRenamed(t, k.ConfigPath, b)
}

// EditConfig reads the configuration file, lets edit change it and writes
// it back (WriteConfig). Restart makes the kubelet read it.
func (k *Kubelet) EditConfig(t testing.TB, edit func(*kubeletv1beta1.KubeletConfiguration)) {
	t.Helper()
	cfg := k.Config(t)
	edit(cfg)
	k.WriteConfig(t, cfg)
}

// writeRenamed writes b to a hidden file beside path (the kubelet's file
// source skips names starting with a dot) and renames it to path.
func writeRenamed(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Start starts the kubelet (after Stop) and waits until its healthz and
// API answer.
func (k *Kubelet) Start() {
	t := k.t
	t.Helper()
	if k.cmd != nil {
		t.Fatal("kubelet already running")
	}
	logf, err := os.OpenFile(k.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(k.bin, k.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	k.cmd = cmd
	k.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(k.exited) }()
	// Generous: the kubelet starts in a second or two when the machine is
	// idle, and these machines are shared.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		why := k.serving()
		if why == "" {
			return
		}
		select {
		case <-k.exited:
			k.cmd = nil
			t.Fatalf("kubelet exited at start:\n%s", k.LogTail(40))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet not serving after 3m (%s):\n%s", why, k.LogTail(40))
		}
	}
}

// serving says why the kubelet does not serve yet, or "".
func (k *Kubelet) serving() string {
	resp, err := k.http.Get("http://" + k.HealthzAddr + "/healthz")
	if err != nil {
		return err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("healthz: %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	code, body, err := k.Get("/pods")
	if err != nil {
		return err.Error()
	}
	if code != http.StatusOK {
		return fmt.Sprintf("/pods: %d %s", code, strings.TrimSpace(string(body)))
	}
	return ""
}

// Stop stops the kubelet (SIGTERM, then SIGKILL after 30s) and leaves its
// pods running, as a kubelet restart on a node does.
func (k *Kubelet) Stop() {
	if k.cmd == nil {
		return
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(30 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.exited
	}
	k.cmd = nil
}

// Restart stops and starts the kubelet: it reads its configuration file
// again and adopts the pods that still run.
func (k *Kubelet) Restart() {
	k.t.Helper()
	k.Stop()
	k.Start()
}

// Pid returns the kubelet's process id (0 while it is stopped).
func (k *Kubelet) Pid() int {
	if k.cmd == nil {
		return 0
	}
	return k.cmd.Process.Pid
}

// LogTail returns the last n lines of the kubelet's log (klog, --v as set).
func (k *Kubelet) LogTail(n int) string {
	b, _ := os.ReadFile(k.LogFile)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanup stops the kubelet, then kills its pods' tasks (the daemon's own
// cleanup, later, stops it; the cgroups go after that), then removes its
// dir.
func (k *Kubelet) cleanup() {
	if k.t.Failed() {
		k.t.Logf("kubelet log tail:\n%s", k.LogTail(40))
	}
	k.Stop()
	if k.Containerd.Client != nil && k.Containerd.cmd != nil {
		k.Containerd.killTasks()
	}
	unmountUnder(k.Dir)
	if err := os.RemoveAll(k.Dir); err != nil {
		k.t.Logf("remove %s: %v", k.Dir, err)
	}
}
