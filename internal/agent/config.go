package agent

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/distribution/reference"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/kubeletconfig"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/trace"
	"github.com/rs/zerolog"
)

// Config is everything `gcagent run` can be told. Flag names follow the
// kubelet where one exists; every flag also reads GCAGENT_<FLAG> from the
// environment and `name = value` lines from --config. Precedence: flag, then
// environment, then file, then default.
type Config struct {
	// ContainerdAddress is containerd's socket. Default /run/containerd/containerd.sock.
	ContainerdAddress string
	// Namespace is the containerd namespaces to manage: a comma-separated
	// list, or * for every one (also those created later). Default k8s.io.
	Namespace string
	// ExcludeNamespace are namespaces never managed (comma-separated).
	// Default moby,plugins.moby: Docker keeps its own state about them.
	ExcludeNamespace string
	// ImageFS is the directory whose filesystem is measured. Default empty:
	// CRI's image filesystem (ImageFsInfo), else /var/lib/containerd.
	ImageFS string
	// ImageGCHighThreshold is the disk usage percent that starts image GC. Default 85.
	ImageGCHighThreshold int
	// ImageGCLowThreshold is the usage percent image GC frees down to. Default 80.
	ImageGCLowThreshold int
	// MinimumImageTTL is the minimum age, from first seen, of an image GC may delete. Default 2m.
	MinimumImageTTL time.Duration
	// ImageMaximumGCAge deletes images unused for longer than this; 0 is off. Default 0.
	ImageMaximumGCAge time.Duration
	// SandboxImage is the pause image; it is also learned from CRI. Default empty.
	SandboxImage string
	// KeepImages are globs; an image with a name one covers is never
	// deleted (gc.KeepCovers: REPO and REPO:* cover REPO's digest
	// references too). Default none.
	KeepImages []string
	// KeepListWait bounds how long image deletes by threshold or maximum
	// age wait, at start, for a fleet keep list this node never read (none
	// saved in the state dir, NATS not answering); after it, image GC goes
	// on with KeepImages only. 0: no wait. Default 5m.
	KeepListWait time.Duration
	// RegretWindow is how long after image GC deleted an image its return
	// to the node is reported as image.regretted. Default 24h.
	RegretWindow time.Duration
	// TraceMaxAge is how long the usage trace (what `gcagent replay` needs)
	// keeps its records; 0 turns the trace off. Default 720h (30 days).
	TraceMaxAge time.Duration
	// TraceMaxBytes bounds the usage trace in the state file. Default 16MiB.
	TraceMaxBytes int64
	// DiskInterval is how often the image filesystem is sampled near the high threshold (up to 1s apart far from it). Default 100ms.
	DiskInterval time.Duration
	// MinimumContainerTTL is how long a dead container is kept after it exits. Default 0s.
	MinimumContainerTTL time.Duration
	// UncollectedExitGrace is how long a plain container's exited task waits
	// for its client to collect it before the agent counts the client as done. Default 10s.
	UncollectedExitGrace time.Duration
	// MaxDeadPerContainer is the dead containers kept per evict unit; -1 is no limit. Default 1.
	MaxDeadPerContainer int
	// MaxDeadContainers is the dead containers kept on the node; -1 is no limit. Default -1.
	MaxDeadContainers int
	// PruneContainers is native, all or off. Default native.
	PruneContainers string
	// NerdctlDataRoot is nerdctl's --data-root: where the containers
	// nerdctl made keep the state (name lock, hosts, state dir with json
	// logs) that is removed after their delete. A nerdctl container whose
	// state lies elsewhere is never deleted. Default /var/lib/nerdctl.
	NerdctlDataRoot string
	// LogDir holds the kubelet's container log symlinks. Default /var/log/containers.
	LogDir string
	// PodLogDir holds the pod log directories. Default /var/log/pods.
	PodLogDir string
	// HostPodLogDir is the pod log dir's path on the host, which the
	// kubelet's link targets start with, when the agent sees that dir at
	// PodLogDir (a DaemonSet mounting it elsewhere, k3s, RKE2, a custom
	// podLogsDir). Default empty: the same as PodLogDir.
	HostPodLogDir string
	// PodLogGrace is how long a pod must be gone before its log dir goes. Default 1m.
	PodLogGrace time.Duration
	// KubeletStatusLag is how long the kubelet's pod status may still name
	// a pod container's previous attempt (its lastState, what `kubectl
	// logs --previous` reads) after the next attempt died; that attempt is
	// kept so long, or until a newer one started. Default 2m, or twice the
	// kubelet's syncFrequency if --kubelet-config says more.
	KubeletStatusLag time.Duration
	// StateDir holds the journal, snapshots and the NATS outbox. Default /var/lib/gcagent.
	StateDir string
	// ResyncInterval is the period of full listings of containerd. Default 5m.
	ResyncInterval time.Duration
	// NodeName names this node in NATS subjects and events. Default the hostname.
	NodeName string
	// Cluster names the fleet in NATS subjects. Default default.
	Cluster string
	// NATSURL is the NATS server; empty starts an embedded one. Default empty.
	NATSURL string
	// NATSCreds, NATSNKey, NATSUser, NATSPassword, NATSToken, NATSTLSCA,
	// NATSTLSCert and NATSTLSKey authenticate to NATS. Default none.
	NATSCreds, NATSNKey, NATSUser, NATSPassword, NATSToken string
	NATSTLSCA, NATSTLSCert, NATSTLSKey                     string
	// EmbeddedNATSListen is where the embedded NATS server listens. Default 127.0.0.1:4222.
	EmbeddedNATSListen string
	// EmbeddedNATSMaxStore bounds the embedded server's JetStream store and
	// the stream in it, so events never fill the disk GC protects. Default 256MiB.
	EmbeddedNATSMaxStore int64
	// EmbeddedNATSMaxAge is how long the embedded server's stream keeps
	// events; at least the duplicate window (the outbox max age, at least 24h). Default 168h.
	EmbeddedNATSMaxAge time.Duration
	// NATSStream is the JetStream stream of events. Default GCAGENT_EVT.
	NATSStream string
	// NATSNoCreateStream uses the streams (events and node status) as they
	// are instead of ensuring them. Default false.
	NATSNoCreateStream bool
	// NATSJSDomain is the JetStream domain that holds the streams: on a leaf
	// node that extends a hub's domain, the hub's. Default: none (the domain
	// of the server connected to).
	NATSJSDomain string
	// OutboxMaxBytes bounds the local outbox of unacked events. Default 64MiB.
	OutboxMaxBytes int64
	// OutboxMaxAge drops unacked events older than this, loudly. Default 24h.
	OutboxMaxAge time.Duration
	// HeartbeatInterval is the period of agent.heartbeat events. Default 30s.
	HeartbeatInterval time.Duration
	// AllowRemoteGC lets NATS control requests run GC. Default false.
	AllowRemoteGC bool
	// Profiling serves Go's profiles under /debug/pprof/ on the metrics
	// address. Default false.
	Profiling bool
	// MetricsAddress serves /metrics, /healthz, /readyz and /status. Default 127.0.0.1:9617.
	MetricsAddress string
	// DryRun plans, logs and publishes but deletes nothing. Default false.
	DryRun bool
	// TakeOver takes containerd's agent lock from the agent that holds it
	// (that one stops at its next renewal); without it a second agent on
	// one containerd refuses to start. Default false.
	TakeOver bool
	// LogFormat is json or console. Default json.
	LogFormat string
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// ConfigFile is the settings file (--config, GCAGENT_CONFIG), one
	// `flag-name = value` per line; cmd/gcagent reads it. Default empty: none.
	ConfigFile string
	// KubeletConfig is the node's KubeletConfiguration file: its image GC
	// thresholds and ages become the defaults of the settings not given
	// otherwise, and its image GC and eviction thresholds are checked
	// against gcagent's (kubelet.go). Default empty: not read.
	KubeletConfig string

	// Kubelet is what AdoptKubelet read from KubeletConfig; nil without one.
	Kubelet *kubeletconfig.Settings `json:"-"`

	// Sources says where each setting given came from, by flag name: "flag",
	// "env GCAGENT_X", "file PATH:LINE"; a setting not in it has its default.
	Sources map[string]string `json:"-"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ContainerdAddress:    "/run/containerd/containerd.sock",
		Namespace:            events.CRINamespace,
		ExcludeNamespace:     strings.Join(events.DefaultExcluded, ","),
		ImageGCHighThreshold: 85,
		ImageGCLowThreshold:  80,
		MinimumImageTTL:      2 * time.Minute,
		UncollectedExitGrace: gc.DefaultUncollectedGrace,
		DiskInterval:         gc.DefaultDiskInterval,
		RegretWindow:         gc.DefaultRegretWindow,
		KeepListWait:         DefaultKeepListWait,
		TraceMaxAge:          trace.DefaultMaxAge,
		TraceMaxBytes:        trace.DefaultMaxBytes,
		MaxDeadPerContainer:  1,
		MaxDeadContainers:    -1,
		PruneContainers:      "native",
		NerdctlDataRoot:      node.DefaultNerdctlDataRoot,
		LogDir:               "/var/log/containers",
		PodLogDir:            "/var/log/pods",
		PodLogGrace:          time.Minute,
		KubeletStatusLag:     gc.DefaultKubeletStatusLag,
		StateDir:             "/var/lib/gcagent",
		ResyncInterval:       5 * time.Minute,
		NodeName:             host,
		Cluster:              "default",
		EmbeddedNATSListen:   "127.0.0.1:4222",
		EmbeddedNATSMaxStore: DefaultEmbeddedNATSMaxStore,
		EmbeddedNATSMaxAge:   natsbus.DefaultStreamMaxAge,
		NATSStream:           natsbus.DefaultStream,
		OutboxMaxBytes:       natsbus.DefaultMaxBytes,
		OutboxMaxAge:         natsbus.DefaultMaxAge,
		HeartbeatInterval:    30 * time.Second,
		MetricsAddress:       "127.0.0.1:9617",
		LogFormat:            "json",
		LogLevel:             "info",
	}
}

// Validate reports the first invalid value, in one line naming the flag.
func (c Config) Validate() error {
	pct := func(name string, v int) error {
		if v < 0 || v > 100 {
			return fmt.Errorf("invalid --%s %d: must be between 0 and 100", name, v)
		}
		return nil
	}
	nonNeg := func(name string, d time.Duration) error {
		if d < 0 {
			return fmt.Errorf("invalid --%s %s: must not be negative", name, d)
		}
		return nil
	}
	checks := []error{
		pct("image-gc-high-threshold", c.ImageGCHighThreshold),
		pct("image-gc-low-threshold", c.ImageGCLowThreshold),
		nonNeg("minimum-image-ttl-duration", c.MinimumImageTTL),
		nonNeg("image-maximum-gc-age", c.ImageMaximumGCAge),
		nonNeg("minimum-container-ttl-duration", c.MinimumContainerTTL),
		func() error {
			if c.UncollectedExitGrace <= 0 {
				return fmt.Errorf("invalid --uncollected-exit-grace %s: must be positive", c.UncollectedExitGrace)
			}
			return nil
		}(),
		nonNeg("pod-log-grace", c.PodLogGrace),
		nonNeg("kubelet-status-lag", c.KubeletStatusLag),
		nonNeg("keep-list-wait", c.KeepListWait),
	}
	for name, v := range map[string]string{"containerd-address": c.ContainerdAddress,
		"state-dir": c.StateDir, "node-name": c.NodeName, "cluster": c.Cluster} {
		if strings.TrimSpace(v) == "" {
			checks = append(checks, fmt.Errorf("invalid --%s: must not be empty", name))
		}
	}
	if c.ImageGCLowThreshold > c.ImageGCHighThreshold {
		if src, given := c.lowGiven(); !given {
			// The user gave the high threshold alone: name the low one's
			// origin and the fix, not a value they never typed.
			checks = append(checks, fmt.Errorf("invalid --image-gc-high-threshold %d: below --image-gc-low-threshold %d (%s); give --image-gc-low-threshold too, e.g. %d",
				c.ImageGCHighThreshold, c.ImageGCLowThreshold, src, c.lowFollowing()))
		} else {
			checks = append(checks, fmt.Errorf("invalid --image-gc-low-threshold %d: must not exceed --image-gc-high-threshold %d", c.ImageGCLowThreshold, c.ImageGCHighThreshold))
		}
	}
	if c.ImageMaximumGCAge > 0 && c.ImageMaximumGCAge <= c.MinimumImageTTL {
		checks = append(checks, fmt.Errorf("invalid --image-maximum-gc-age %s: must be greater than --minimum-image-ttl-duration %s", c.ImageMaximumGCAge, c.MinimumImageTTL))
	}
	if c.RegretWindow <= 0 {
		checks = append(checks, fmt.Errorf("invalid --regret-window %s: must be positive", c.RegretWindow))
	}
	if c.TraceMaxAge < 0 {
		checks = append(checks, fmt.Errorf("invalid --trace-max-age %s: must not be negative (0 turns the trace off)", c.TraceMaxAge))
	}
	if c.TraceMaxAge > 0 && c.TraceMaxBytes < minTraceMaxBytes {
		checks = append(checks, fmt.Errorf("invalid --trace-max-bytes %d: must be at least %d (1 MiB)", c.TraceMaxBytes, minTraceMaxBytes))
	}
	if c.DiskInterval <= 0 {
		checks = append(checks, fmt.Errorf("invalid --disk-interval %s: must be positive", c.DiskInterval))
	}
	if c.ResyncInterval < time.Second {
		checks = append(checks, fmt.Errorf("invalid --resync-interval %s: must be at least 1s", c.ResyncInterval))
	}
	if c.MaxDeadPerContainer < -1 {
		checks = append(checks, fmt.Errorf("invalid --maximum-dead-containers-per-container %d: must be -1 (no limit) or more", c.MaxDeadPerContainer))
	}
	if c.MaxDeadContainers < -1 {
		checks = append(checks, fmt.Errorf("invalid --maximum-dead-containers %d: must be -1 (no limit) or more", c.MaxDeadContainers))
	}
	switch c.PruneContainers {
	case "native", "all", "off":
	default:
		checks = append(checks, fmt.Errorf("invalid --prune-containers %q: must be native, all or off", c.PruneContainers))
	}
	if !filepath.IsAbs(c.NerdctlDataRoot) {
		checks = append(checks, fmt.Errorf("invalid --nerdctl-data-root %q: must be an absolute path", c.NerdctlDataRoot))
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		checks = append(checks, fmt.Errorf("invalid --log-format %q: must be json or console", c.LogFormat))
	}
	if c.HeartbeatInterval < time.Second {
		checks = append(checks, fmt.Errorf("invalid --heartbeat-interval %s: must be at least 1s", c.HeartbeatInterval))
	}
	if c.OutboxMaxBytes <= 0 || c.OutboxMaxAge <= 0 {
		checks = append(checks, fmt.Errorf("invalid outbox bounds --outbox-max-bytes %d --outbox-max-age %s: must be positive", c.OutboxMaxBytes, c.OutboxMaxAge))
	}
	checks = append(checks, c.natsFlagErrors()...)
	if err := validNATSURLs(c.NATSURL); err != nil {
		checks = append(checks, fmt.Errorf("invalid --nats-url %q: %v", c.NATSURL, err))
	}
	if c.NATSURL != "" {
		if err := c.ConnOptions().Validate(); err != nil {
			checks = append(checks, fmt.Errorf("invalid NATS settings: %v", err))
		}
	}
	if c.NATSURL == "" && !natsbus.EmbeddedBuilt {
		checks = append(checks, errors.New("missing --nats-url: this gcagent was built without the embedded NATS server (-tags noembeddednats)"))
	} else if c.NATSURL == "" {
		if err := validAddress(c.EmbeddedNATSListen); err != nil {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-listen %q: %v", c.EmbeddedNATSListen, err))
		}
		if c.EmbeddedNATSMaxStore < minEmbeddedNATSMaxStore {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-max-store %d: must be at least %d (1 MiB)", c.EmbeddedNATSMaxStore, minEmbeddedNATSMaxStore))
		}
		if w := max(c.OutboxMaxAge, natsbus.DefaultDuplicateWindow); c.EmbeddedNATSMaxAge < w {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-max-age %s: must be at least the duplicate window %s (the outbox max age, at least 24h)", c.EmbeddedNATSMaxAge, w))
		}
	}
	if err := c.PublisherOptions().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid NATS settings: %v", err))
	}
	if err := validAddress(c.MetricsAddress); err != nil {
		checks = append(checks, fmt.Errorf("invalid --metrics-address %q: %v", c.MetricsAddress, err))
	}
	if c.HostPodLogDir != "" && !filepath.IsAbs(c.HostPodLogDir) {
		checks = append(checks, fmt.Errorf("invalid --host-pod-log-dir %q: must be an absolute path", c.HostPodLogDir))
	}
	if c.ImageFS != "" && !filepath.IsAbs(c.ImageFS) {
		checks = append(checks, fmt.Errorf("invalid --image-fs %q: must be an absolute path", c.ImageFS))
	}
	if c.SandboxImage != "" {
		if _, err := reference.ParseAnyReference(c.SandboxImage); err != nil {
			checks = append(checks, fmt.Errorf("invalid --sandbox-image %q: %v", c.SandboxImage, err))
		}
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		checks = append(checks, fmt.Errorf("invalid --log-level %q: must be debug, info, warn or error", c.LogLevel))
	}
	for _, p := range c.KeepImages {
		if err := gc.ValidKeepPattern(p); err != nil {
			checks = append(checks, fmt.Errorf("invalid --keep-image %q: %v", p, err))
		}
	}
	if _, err := c.Namespaces(); err != nil {
		checks = append(checks, fmt.Errorf("invalid %v", err))
	}
	// Then each component's own rules, so nothing starts with a setting it
	// would refuse.
	if err := c.LogsConfig().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid log dirs: %v", err))
	}
	if err := c.ContainerPolicy().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid container GC settings: %v", err))
	}
	if err := c.ImagePolicy().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid image GC settings: %v", err))
	}
	for _, err := range checks {
		if err != nil {
			return c.locate(err)
		}
	}
	return nil
}

// locate prefixes err with where the first setting it names came from,
// when that is a line of the config file or a variable ("PATH:LINE: invalid
// --image-gc-high-threshold 150: ..."), as every error about a file line
// or a variable starts.
func (c Config) locate(err error) error {
	m := flagNamed.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	switch src := c.Sources[m[1]]; {
	case strings.HasPrefix(src, "file "):
		return fmt.Errorf("%s: %w", strings.TrimPrefix(src, "file "), err)
	case strings.HasPrefix(src, "env "):
		return fmt.Errorf("%s: %w", strings.TrimPrefix(src, "env "), err)
	}
	return err
}

// flagNamed finds the first flag an error names.
var flagNamed = regexp.MustCompile(`--([a-z0-9]+(?:-[a-z0-9]+)*)`)

// MovedSource starts the source of a low threshold FollowHigh moved: it
// was not given, so a what-if does not send it.
const MovedSource = "moved with --image-gc-high-threshold"

// lowGiven reports whether the low threshold was given (flag, variable or
// file line), and where it came from otherwise ("default", or the kubelet's
// config).
func (c Config) lowGiven() (string, bool) {
	src := c.Sources["image-gc-low-threshold"]
	switch {
	case src == "":
		return "default", false
	case strings.HasPrefix(src, "kubelet-config "), strings.HasPrefix(src, MovedSource):
		return src, false
	}
	return src, true
}

// lowFollowing is the low threshold that follows the high one
// (gc.LowFollowing), keeping the gap of the pair the low one came with: the
// kubelet's config, else the defaults.
func (c Config) lowFollowing() int {
	wasHigh := DefaultConfig().ImageGCHighThreshold
	if src, _ := c.lowGiven(); strings.HasPrefix(src, "kubelet-config ") && c.Kubelet != nil {
		wasHigh = c.Kubelet.HighThreshold
	}
	return gc.LowFollowing(wasHigh, c.ImageGCLowThreshold, c.ImageGCHighThreshold)
}

// FollowHigh reads a high threshold given alone as a what-if does (plan,
// replay): a low threshold not given that would exceed it moves down with
// it, keeping the gap of its pair (the default 80 with 70: 65), and its
// source says so (MovedSource). It returns what moved, for the output, or
// "". run and check do not call it: Validate refuses the pair there,
// naming where the low threshold came from.
func (c *Config) FollowHigh() string {
	src, given := c.lowGiven()
	if given || c.ImageGCLowThreshold <= c.ImageGCHighThreshold {
		return ""
	}
	was := c.ImageGCLowThreshold
	c.ImageGCLowThreshold = c.lowFollowing()
	if c.Sources == nil {
		c.Sources = map[string]string{}
	}
	c.Sources["image-gc-low-threshold"] = fmt.Sprintf("%s: %d%% (%s) would exceed it", MovedSource, was, src)
	return fmt.Sprintf("--image-gc-low-threshold %d%% (%s) exceeds --image-gc-high-threshold %d%%: planned with %d%%, the same distance below (run refuses the pair: give both)",
		was, src, c.ImageGCHighThreshold, c.ImageGCLowThreshold)
}

// minTraceMaxBytes is the least --trace-max-bytes: the base alone (the
// images present) takes about 100 bytes an image.
const minTraceMaxBytes = 1 << 20

// validAddress checks a host:port listen address; the host may be empty
// (every address) and the port 0 (any free port).
func validAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port, e.g. 127.0.0.1:9617 or :9617")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// natsFlagErrors checks the NATS client settings flag by flag, so that an
// error names the flag; natsbus's own checks follow as a backstop.
func (c Config) natsFlagErrors() []error {
	var errs []error
	set := []struct{ flag, value string }{
		{"nats-creds", c.NATSCreds}, {"nats-nkey", c.NATSNKey}, {"nats-user", c.NATSUser},
		{"nats-password", c.NATSPassword}, {"nats-token", c.NATSToken},
		{"nats-tls-ca", c.NATSTLSCA}, {"nats-tls-cert", c.NATSTLSCert}, {"nats-tls-key", c.NATSTLSKey},
	}
	for _, f := range set {
		if f.value == "" {
			continue
		}
		if c.NATSURL == "" {
			errs = append(errs, fmt.Errorf("invalid --%s: needs --nats-url (the embedded server uses its own nkey)", f.flag))
			continue
		}
		switch f.flag {
		case "nats-creds", "nats-nkey", "nats-tls-ca", "nats-tls-cert", "nats-tls-key":
			if _, err := os.Stat(f.value); err != nil {
				errs = append(errs, fmt.Errorf("invalid --%s %q: %v", f.flag, f.value, errors.Unwrap(err)))
			}
		}
	}
	auth := 0
	for _, on := range []bool{c.NATSCreds != "", c.NATSNKey != "", c.NATSUser != "" || c.NATSPassword != "", c.NATSToken != ""} {
		if on {
			auth++
		}
	}
	switch {
	case auth > 1:
		errs = append(errs, errors.New("invalid NATS credentials: use only one of --nats-creds, --nats-nkey, --nats-user with --nats-password, and --nats-token"))
	case c.NATSPassword != "" && c.NATSUser == "":
		errs = append(errs, errors.New("invalid --nats-password: needs --nats-user"))
	case (c.NATSTLSCert == "") != (c.NATSTLSKey == ""):
		errs = append(errs, errors.New("invalid --nats-tls-cert and --nats-tls-key: give both or neither"))
	}
	if natsbus.SafeToken(c.NATSStream) != c.NATSStream || strings.ContainsAny(c.NATSStream, "/\\") || c.NATSStream == "" {
		errs = append(errs, fmt.Errorf("invalid --nats-stream %q: no spaces, dots, *, > or slashes", c.NATSStream))
	}
	if !natsbus.ValidDomain(c.NATSJSDomain) {
		errs = append(errs, fmt.Errorf("invalid --nats-js-domain %q: one subject token, no spaces, dots, *, > or slashes", c.NATSJSDomain))
	}
	for _, f := range []struct{ flag, value string }{{"node-name", c.NodeName}, {"cluster", c.Cluster}} {
		if strings.IndexFunc(f.value, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			errs = append(errs, fmt.Errorf("invalid --%s %q: must be printable", f.flag, f.value))
		}
	}
	return errs
}

// validNATSURLs checks a comma-separated list of NATS server URLs.
func validNATSURLs(list string) error {
	if list == "" {
		return nil
	}
	for _, raw := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Host == "" {
			return fmt.Errorf("%q: want a URL such as nats://host:4222", strings.TrimSpace(raw))
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%q: scheme %q: want nats, tls, ws or wss", raw, u.Scheme)
		}
	}
	return nil
}

// namespaces are the managed namespaces --namespace and
// --exclude-namespace describe.
func (c Config) Namespaces() (events.Namespaces, error) {
	return events.ParseNamespaces(c.Namespace, c.ExcludeNamespace)
}

// DefaultContainerdRoot is measured for image GC when --image-fs is not
// given and CRI cannot say where its image filesystem is.
const DefaultContainerdRoot = "/var/lib/containerd"

// HasNATSAuth reports whether any NATS credential is configured.
func (c Config) HasNATSAuth() bool {
	return c.NATSCreds != "" || c.NATSNKey != "" || c.NATSUser != "" || c.NATSPassword != "" || c.NATSToken != "" || c.NATSTLSCert != ""
}
