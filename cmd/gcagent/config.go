package main

import (
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/node"

	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/gcagent/gcagent/natsbus"
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
	// KeepImages are globs; an image with a matching name is never deleted. Default none.
	KeepImages []string
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
	// PodLogGrace is how long a pod must be gone before its log dir goes. Default 1m.
	PodLogGrace time.Duration
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
	// NATSNoCreateStream uses the stream as it is instead of ensuring it. Default false.
	NATSNoCreateStream bool
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
	// LogFormat is json or console. Default json.
	LogFormat string
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
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
		MaxDeadPerContainer:  1,
		MaxDeadContainers:    -1,
		PruneContainers:      "native",
		NerdctlDataRoot:      node.DefaultNerdctlDataRoot,
		LogDir:               "/var/log/containers",
		PodLogDir:            "/var/log/pods",
		PodLogGrace:          time.Minute,
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
	}
	if c.ImageGCLowThreshold > c.ImageGCHighThreshold {
		checks = append(checks, fmt.Errorf("invalid --image-gc-low-threshold %d: must not exceed --image-gc-high-threshold %d", c.ImageGCLowThreshold, c.ImageGCHighThreshold))
	}
	if c.ImageMaximumGCAge > 0 && c.ImageMaximumGCAge <= c.MinimumImageTTL {
		checks = append(checks, fmt.Errorf("invalid --image-maximum-gc-age %s: must be greater than --minimum-image-ttl-duration %s", c.ImageMaximumGCAge, c.MinimumImageTTL))
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
	if c.NATSURL != "" {
		if err := c.connOptions().Validate(); err != nil {
			checks = append(checks, fmt.Errorf("invalid NATS settings: %v", err))
		}
	}
	if c.NATSURL == "" && !natsbus.EmbeddedBuilt {
		checks = append(checks, errors.New("missing --nats-url: this gcagent was built without the embedded NATS server (-tags noembeddednats)"))
	} else if c.NATSURL == "" {
		if err := c.embeddedOptions().Validate(); err != nil {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-listen or --state-dir: %v", err))
		}
		if c.EmbeddedNATSMaxStore < minEmbeddedNATSMaxStore {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-max-store %d: must be at least %d (1 MiB)", c.EmbeddedNATSMaxStore, minEmbeddedNATSMaxStore))
		}
		if w := max(c.OutboxMaxAge, natsbus.DefaultDuplicateWindow); c.EmbeddedNATSMaxAge < w {
			checks = append(checks, fmt.Errorf("invalid --embedded-nats-max-age %s: must be at least the duplicate window %s (the outbox max age, at least 24h)", c.EmbeddedNATSMaxAge, w))
		}
	}
	if err := c.publisherOptions().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid NATS settings: %v", err))
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		checks = append(checks, fmt.Errorf("invalid --log-level %q: must be debug, info, warn or error", c.LogLevel))
	}
	for _, p := range c.KeepImages {
		if _, err := path.Match(p, ""); err != nil {
			checks = append(checks, fmt.Errorf("invalid --keep-image %q: %v", p, err))
		}
	}
	if _, err := c.namespaces(); err != nil {
		checks = append(checks, fmt.Errorf("invalid %v", err))
	}
	for name, v := range map[string]string{"containerd-address": c.ContainerdAddress,
		"state-dir": c.StateDir, "node-name": c.NodeName, "cluster": c.Cluster} {
		if strings.TrimSpace(v) == "" {
			checks = append(checks, fmt.Errorf("invalid --%s: must not be empty", name))
		}
	}
	// Then each component's own rules, so nothing starts with a setting it
	// would refuse.
	if err := c.logsConfig().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid log dirs: %v", err))
	}
	if err := c.containerPolicy().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid container GC settings: %v", err))
	}
	if err := c.imagePolicy().Validate(); err != nil {
		checks = append(checks, fmt.Errorf("invalid image GC settings: %v", err))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}

// namespaces are the managed namespaces --namespace and
// --exclude-namespace describe.
func (c Config) namespaces() (events.Namespaces, error) {
	return events.ParseNamespaces(c.Namespace, c.ExcludeNamespace)
}

// stringList is a repeatable flag.
type stringList struct{ p *[]string }

func (s stringList) String() string {
	if s.p == nil {
		return ""
	}
	return strings.Join(*s.p, ",")
}
func (s stringList) Set(v string) error { *s.p = append(*s.p, v); return nil }

// runFlags binds the flags of `gcagent run` to cfg.
func runFlags(cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.String("config", "", "file of `name = value` lines (flags and environment win)")
	fs.StringVar(&cfg.ContainerdAddress, "containerd-address", cfg.ContainerdAddress, "containerd socket")
	fs.StringVar(&cfg.Namespace, "namespace", cfg.Namespace, "containerd namespaces to manage: comma-separated, or * for every one (also those created later)")
	fs.StringVar(&cfg.ExcludeNamespace, "exclude-namespace", cfg.ExcludeNamespace, "containerd namespaces never to manage, comma-separated (Docker's by default)")
	fs.StringVar(&cfg.ImageFS, "image-fs", cfg.ImageFS, "directory whose filesystem is measured for image GC (default: CRI's image filesystem, as the kubelet measures, else /var/lib/containerd)")
	fs.IntVar(&cfg.ImageGCHighThreshold, "image-gc-high-threshold", cfg.ImageGCHighThreshold, "disk usage percent that starts image GC (100 disables)")
	fs.IntVar(&cfg.ImageGCLowThreshold, "image-gc-low-threshold", cfg.ImageGCLowThreshold, "disk usage percent image GC frees down to")
	fs.DurationVar(&cfg.MinimumImageTTL, "minimum-image-ttl-duration", cfg.MinimumImageTTL, "minimum age of an image, from first seen, before GC may delete it")
	fs.DurationVar(&cfg.ImageMaximumGCAge, "image-maximum-gc-age", cfg.ImageMaximumGCAge, "delete images unused for longer than this, whatever the disk (0 = off)")
	fs.StringVar(&cfg.SandboxImage, "sandbox-image", cfg.SandboxImage, "pause image never to delete (also learned from CRI)")
	fs.Var(stringList{&cfg.KeepImages}, "keep-image", "glob on image names never to delete (repeatable)")
	fs.DurationVar(&cfg.DiskInterval, "disk-interval", cfg.DiskInterval, "how often the image filesystem is sampled")
	fs.DurationVar(&cfg.MinimumContainerTTL, "minimum-container-ttl-duration", cfg.MinimumContainerTTL, "how long a dead container is kept after it exits")
	fs.DurationVar(&cfg.UncollectedExitGrace, "uncollected-exit-grace", cfg.UncollectedExitGrace, "how long a plain container's exit waits for its client to collect it")
	fs.IntVar(&cfg.MaxDeadPerContainer, "maximum-dead-containers-per-container", cfg.MaxDeadPerContainer, "dead CRI containers kept per pod container (-1 = no limit; plain containers go by their TTL)")
	fs.IntVar(&cfg.MaxDeadContainers, "maximum-dead-containers", cfg.MaxDeadContainers, "dead containers kept on the node (-1 = no limit)")
	fs.StringVar(&cfg.PruneContainers, "prune-containers", cfg.PruneContainers, "which dead containers to remove: native, all or off")
	fs.StringVar(&cfg.NerdctlDataRoot, "nerdctl-data-root", cfg.NerdctlDataRoot, "nerdctl's --data-root: the state of a removed nerdctl container is cleaned there; one whose state lies elsewhere is kept")
	fs.StringVar(&cfg.LogDir, "log-dir", cfg.LogDir, "container log symlink directory")
	fs.StringVar(&cfg.PodLogDir, "pod-log-dir", cfg.PodLogDir, "pod log directory")
	fs.DurationVar(&cfg.PodLogGrace, "pod-log-grace", cfg.PodLogGrace, "how long a pod must be gone before its log dir is removed")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "where the journal, snapshots and NATS outbox live")
	fs.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "period of full listings of containerd")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "node name in NATS subjects and events")
	natsClientFlags(fs, cfg) // --nats-url (empty: embedded server), auth, --cluster, --nats-stream
	fs.StringVar(&cfg.EmbeddedNATSListen, "embedded-nats-listen", cfg.EmbeddedNATSListen, "listen address of the embedded NATS server")
	fs.Int64Var(&cfg.EmbeddedNATSMaxStore, "embedded-nats-max-store", cfg.EmbeddedNATSMaxStore, "bound of the embedded NATS server's JetStream store and stream, in bytes")
	fs.DurationVar(&cfg.EmbeddedNATSMaxAge, "embedded-nats-max-age", cfg.EmbeddedNATSMaxAge, "how long the embedded NATS server's stream keeps events")
	fs.BoolVar(&cfg.NATSNoCreateStream, "nats-no-create-stream", cfg.NATSNoCreateStream, "use the stream as it is instead of creating or updating it")
	fs.Int64Var(&cfg.OutboxMaxBytes, "outbox-max-bytes", cfg.OutboxMaxBytes, "bound of the local outbox of unacked events, in bytes")
	fs.DurationVar(&cfg.OutboxMaxAge, "outbox-max-age", cfg.OutboxMaxAge, "unacked events older than this are dropped (and logged)")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "period of agent.heartbeat events")
	fs.BoolVar(&cfg.AllowRemoteGC, "allow-remote-gc", cfg.AllowRemoteGC, "let NATS control requests run GC")
	fs.BoolVar(&cfg.Profiling, "profiling", cfg.Profiling, "serve Go's profiles (heap, CPU) under /debug/pprof/ on the metrics address; without it allocations are not sampled")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "address of /metrics, /healthz, /readyz and /status")
	fs.BoolVar(&cfg.DryRun, "dry-run", cfg.DryRun, "plan, log and publish, but delete nothing")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "json or console")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	return fs
}

// parseRun parses `gcagent run` arguments, the environment and the config
// file into a validated Config.
func parseRun(args []string, env func(string) string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := runFlags(&cfg)
	fs.SetOutput(io.Discard) // errors are one line; -h prints the flags
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: gcagent run [flags]")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	onCLI := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCLI[f.Name] = true })
	file := fs.Lookup("config").Value.String()
	if file == "" {
		file = env("GCAGENT_CONFIG")
	}
	if file != "" {
		kv, err := readConfigFile(file)
		if err != nil {
			return cfg, err
		}
		for _, e := range kv {
			if onCLI[e[0]] || env(envName(e[0])) != "" {
				continue
			}
			if err := setFlag(fs, e[0], e[1], file); err != nil {
				return cfg, err
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v := env(envName(f.Name)); v != "" && !onCLI[f.Name] && f.Name != "config" && err == nil {
			err = setFlag(fs, f.Name, v, envName(f.Name))
		}
	})
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func setFlag(fs *flag.FlagSet, name, value, from string) error {
	if fs.Lookup(name) == nil || name == "config" {
		return fmt.Errorf("%s: unknown setting %q", from, name)
	}
	if err := fs.Set(name, value); err != nil {
		return fmt.Errorf("%s: invalid value %q for %s: %v", from, value, name, err)
	}
	return nil
}

func envName(flagName string) string {
	return "GCAGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// readConfigFile reads `name = value` lines; # starts a comment.
func readConfigFile(file string) ([][2]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("config %s:%d: want name = value", file, n)
		}
		out = append(out, [2]string{strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`)})
	}
	return out, sc.Err()
}

// defaultContainerdRoot is measured for image GC when --image-fs is not
// given and CRI cannot say where its image filesystem is.
const defaultContainerdRoot = "/var/lib/containerd"
