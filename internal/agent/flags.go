package agent

import (
	"slices"

	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/spf13/pflag"
)

// FlagGroup is one area of the flags of `gcagent run` (image GC, container
// GC, NATS, ...), bound to a Config. A command takes an area in one line,
// e.g. agent.ImageGCFlags.AddTo(cmd.Flags(), &cfg): the same names, help,
// defaults and value checks as run. Every flag of a group is also read from
// GCAGENT_<FLAG> and from the config file (cmd/gcagent applies the
// precedence: flag, environment, file, kubelet config, default).
type FlagGroup struct {
	// Title heads the group's flags in help.
	Title string
	add   func(fs *pflag.FlagSet, c *Config)
}

// GroupAnnotation is the pflag annotation that holds a flag's group title:
// help lists flags by it, and only flags that have it read the environment.
const GroupAnnotation = "gcagent.group"

// AddTo defines the group's flags on fs, bound to c, in the group's order;
// with names, only those.
func (g FlagGroup) AddTo(fs *pflag.FlagSet, c *Config, names ...string) {
	tmp := pflag.NewFlagSet(g.Title, pflag.ContinueOnError)
	tmp.SortFlags = false
	g.add(tmp, c)
	tmp.VisitAll(func(f *pflag.Flag) {
		if len(names) > 0 && !slices.Contains(names, f.Name) {
			return
		}
		f.Annotations = map[string][]string{GroupAnnotation: {g.Title}}
		fs.AddFlag(f)
	})
}

// Names are the names of the group's flags, in order.
func (g FlagGroup) Names() []string {
	tmp := pflag.NewFlagSet(g.Title, pflag.ContinueOnError)
	tmp.SortFlags = false
	var c Config
	g.add(tmp, &c)
	var out []string
	tmp.VisitAll(func(f *pflag.Flag) { out = append(out, f.Name) })
	return out
}

// The areas of run's flags. The defaults shown are those of the Config
// bound, so bind DefaultConfig().
var (
	// GeneralFlags: the config file, dry run and the agent's own log.
	GeneralFlags = FlagGroup{"General", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "settings `file`, one flag-name = value per line (flags and environment win)")
		flagvalue.Add(fs, flagvalue.Bool{P: &c.DryRun}, "dry-run", "plan, log and publish, but delete nothing")
		fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
		fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or console")
	}}

	// ImageGCFlags: when images go and which never do.
	ImageGCFlags = FlagGroup{"Image GC", func(fs *pflag.FlagSet, c *Config) {
		flagvalue.Add(fs, flagvalue.Percent{P: &c.ImageGCHighThreshold}, "image-gc-high-threshold", "disk usage percent that starts image GC (100 disables)")
		flagvalue.Add(fs, flagvalue.Percent{P: &c.ImageGCLowThreshold}, "image-gc-low-threshold", "disk usage percent image GC frees down to")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.MinimumImageTTL}, "minimum-image-ttl-duration", "minimum age of an image, from first seen, before GC may delete it")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.ImageMaximumGCAge}, "image-maximum-gc-age", "delete images unused for longer than this, whatever the disk (0 = off)")
		flagvalue.Add(fs, flagvalue.Strings{P: &c.KeepImages}, "keep-image", "`glob` on image names never to delete (repeatable); REPO or REPO:* also keeps REPO's digest-pinned images (REPO@sha256:...), another tag glob does not")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.KeepListWait}, "keep-list-wait", "how long image deletes by threshold or maximum age wait at start for a fleet keep list this node never read (none saved, NATS not answering); then GC goes on with --keep-image only (0 = no wait)")
		fs.StringVar(&c.SandboxImage, "sandbox-image", c.SandboxImage, "pause `image` never to delete (also learned from CRI)")
		fs.StringVar(&c.ImageFS, "image-fs", c.ImageFS, "`dir` whose filesystem is measured for image GC (default: CRI's image filesystem, as the kubelet measures, else /var/lib/containerd)")
		fs.StringVar(&c.KubeletConfig, "kubelet-config", c.KubeletConfig, "the node's KubeletConfiguration `file` (e.g. /var/lib/kubelet/config.yaml): its image GC thresholds and ages are the defaults here; its own image GC and eviction thresholds are checked")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.DiskInterval}, "disk-interval", "how often the image filesystem is sampled")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.RegretWindow}, "regret-window", "an image that image GC deleted and that comes back within this is reported as image.regretted")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.TraceMaxAge}, "trace-max-age", "how long the usage trace (what gcagent replay reads) keeps records; 0 turns it off")
		flagvalue.Add(fs, flagvalue.Bytes{P: &c.TraceMaxBytes}, "trace-max-bytes", "bound of the usage trace in the state file (bytes, or 16MiB)")
	}}

	// ContainerGCFlags: which dead containers go, and when.
	ContainerGCFlags = FlagGroup{"Container GC", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.PruneContainers, "prune-containers", c.PruneContainers, "which dead containers to remove: native, all or off")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.MinimumContainerTTL}, "minimum-container-ttl-duration", "how long a dead container is kept after it exits")
		flagvalue.Add(fs, flagvalue.Int{P: &c.MaxDeadPerContainer, Hint: "-1 = no limit"}, "maximum-dead-containers-per-container", "dead CRI containers kept per pod container (-1 = no limit; plain containers go by their TTL)")
		flagvalue.Add(fs, flagvalue.Int{P: &c.MaxDeadContainers, Hint: "-1 = no limit"}, "maximum-dead-containers", "dead containers kept on the node (-1 = no limit)")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.UncollectedExitGrace}, "uncollected-exit-grace", "how long a plain container's exit waits for its client to collect it")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.KubeletStatusLag}, "kubelet-status-lag", "how long a pod container's previous attempt is kept after the next one dies, while the kubelet's pod status may still name it (kubectl logs --previous), unless a newer attempt started")
		fs.StringVar(&c.NerdctlDataRoot, "nerdctl-data-root", c.NerdctlDataRoot, "nerdctl's --data-root: the state of a removed nerdctl container is cleaned there; one whose state lies elsewhere is kept")
	}}

	// LogFlags: the kubelet's container logs the agent cleans.
	LogFlags = FlagGroup{"Log cleanup", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.LogDir, "log-dir", c.LogDir, "container log symlink directory")
		fs.StringVar(&c.PodLogDir, "pod-log-dir", c.PodLogDir, "pod log directory")
		fs.StringVar(&c.HostPodLogDir, "host-pod-log-dir", c.HostPodLogDir, "the pod log directory's path on the host, which the kubelet's log links point into, when it is mounted at --pod-log-dir (default: the same)")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.PodLogGrace}, "pod-log-grace", "how long a pod must be gone before its log dir is removed")
	}}

	// ContainerdFlags: which containerd, which namespaces.
	ContainerdFlags = FlagGroup{"containerd", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.ContainerdAddress, "containerd-address", c.ContainerdAddress, "containerd `socket`")
		fs.StringVar(&c.Namespace, "namespace", c.Namespace, "containerd namespaces to manage: comma-separated, or * for every one (also those created later)")
		fs.StringVar(&c.ExcludeNamespace, "exclude-namespace", c.ExcludeNamespace, "containerd namespaces never to manage, comma-separated (Docker's by default)")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.ResyncInterval}, "resync-interval", "period of full listings of containerd")
		flagvalue.Add(fs, flagvalue.Bool{P: &c.TakeOver}, "take-over", "take containerd over from the agent running on it, which stops (without it, a second agent on one containerd refuses to start)")
	}}

	// StateFlags: where the agent keeps its state.
	StateFlags = FlagGroup{"State", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "where the journal, snapshots and NATS outbox live")
	}}

	// NATSClientFlags: the NATS server, its credentials and streams; the
	// NATS tools (watch, ctl) take them too.
	NATSClientFlags = FlagGroup{"NATS", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS server URLs, comma separated (empty: start an embedded server)")
		fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name in NATS subjects and events")
		fs.StringVar(&c.NATSCreds, "nats-creds", c.NATSCreds, "NATS credentials `file`")
		fs.StringVar(&c.NATSNKey, "nats-nkey", c.NATSNKey, "NATS nkey seed `file`")
		fs.StringVar(&c.NATSUser, "nats-user", c.NATSUser, "NATS user")
		fs.StringVar(&c.NATSPassword, "nats-password", c.NATSPassword, "NATS password")
		fs.StringVar(&c.NATSToken, "nats-token", c.NATSToken, "NATS token")
		fs.StringVar(&c.NATSTLSCA, "nats-tls-ca", c.NATSTLSCA, "CA `file` for the NATS server certificate")
		fs.StringVar(&c.NATSTLSCert, "nats-tls-cert", c.NATSTLSCert, "client certificate `file` for NATS mTLS")
		fs.StringVar(&c.NATSTLSKey, "nats-tls-key", c.NATSTLSKey, "client key `file` for NATS mTLS")
		fs.StringVar(&c.NATSStream, "nats-stream", c.NATSStream, "JetStream stream of events")
		fs.StringVar(&c.NATSJSDomain, "nats-js-domain", c.NATSJSDomain, "JetStream domain of the streams (on a leaf node: the hub's domain); empty: the server's own")
	}}

	// NATSAgentFlags: how the agent publishes to NATS.
	NATSAgentFlags = FlagGroup{"NATS", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node name in NATS subjects and events (default: the host name)")
		fs.Lookup("node-name").DefValue = "" // the host's: help is the same on every host
		flagvalue.Add(fs, flagvalue.Bool{P: &c.NATSNoCreateStream}, "nats-no-create-stream", "use the stream as it is instead of creating or updating it")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.HeartbeatInterval}, "heartbeat-interval", "period of agent.heartbeat events")
		flagvalue.Add(fs, flagvalue.Bool{P: &c.AllowRemoteGC}, "allow-remote-gc", "let NATS control requests run GC")
		flagvalue.Add(fs, flagvalue.Bytes{P: &c.OutboxMaxBytes}, "outbox-max-bytes", "bound of the local outbox of unacked events (bytes, or 256MiB, 1GiB)")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.OutboxMaxAge}, "outbox-max-age", "unacked events older than this are dropped (and logged)")
	}}

	// EmbeddedNATSFlags: the NATS server the agent starts without --nats-url.
	EmbeddedNATSFlags = FlagGroup{"Embedded NATS", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.EmbeddedNATSListen, "embedded-nats-listen", c.EmbeddedNATSListen, "listen address of the embedded NATS server")
		flagvalue.Add(fs, flagvalue.Bytes{P: &c.EmbeddedNATSMaxStore}, "embedded-nats-max-store", "bound of the embedded NATS server's JetStream store and stream (bytes, or 256MiB, 1GiB)")
		flagvalue.Add(fs, flagvalue.Duration{P: &c.EmbeddedNATSMaxAge}, "embedded-nats-max-age", "how long the embedded NATS server's stream keeps events")
	}}

	// EndpointFlags: the agent's HTTP endpoints.
	EndpointFlags = FlagGroup{"Endpoint", func(fs *pflag.FlagSet, c *Config) {
		fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "`host:port` of the agent's /metrics, /healthz, /readyz, /status, /plan and /trace")
		flagvalue.Add(fs, flagvalue.Bool{P: &c.Profiling}, "profiling", "serve Go's profiles (heap, CPU) under /debug/pprof/ on the metrics address; without it allocations are not sampled")
	}}
)

// RunFlags are the areas of `gcagent run`'s flags, in the order of its help.
var RunFlags = []FlagGroup{GeneralFlags, ImageGCFlags, ContainerGCFlags, LogFlags, ContainerdFlags, StateFlags,
	NATSClientFlags, NATSAgentFlags, EmbeddedNATSFlags, EndpointFlags}
