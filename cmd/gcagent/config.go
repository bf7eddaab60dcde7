package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
)

// stringList is a repeatable flag.
type stringList struct{ p *[]string }

func (s stringList) String() string {
	if s.p == nil {
		return ""
	}
	return strings.Join(*s.p, ",")
}
func (s stringList) Set(v string) error { *s.p = append(*s.p, v); return nil }

// runFlags binds the flags of `gcagent run` (and plan, which takes them
// all: name says which) to cfg.
func runFlags(name string, cfg *agent.Config) *flag.FlagSet {
	fs := newFlagSet(name)
	fs.String("config", "", "settings file, one `flag-name = value` per line (flags and environment win)")
	fs.StringVar(&cfg.ContainerdAddress, "containerd-address", cfg.ContainerdAddress, "containerd socket")
	fs.StringVar(&cfg.Namespace, "namespace", cfg.Namespace, "containerd namespaces to manage: comma-separated, or * for every one (also those created later)")
	fs.StringVar(&cfg.ExcludeNamespace, "exclude-namespace", cfg.ExcludeNamespace, "containerd namespaces never to manage, comma-separated (Docker's by default)")
	fs.StringVar(&cfg.ImageFS, "image-fs", cfg.ImageFS, "directory whose filesystem is measured for image GC (default: CRI's image filesystem, as the kubelet measures, else /var/lib/containerd)")
	fs.IntVar(&cfg.ImageGCHighThreshold, "image-gc-high-threshold", cfg.ImageGCHighThreshold, "disk usage percent that starts image GC (100 disables)")
	fs.IntVar(&cfg.ImageGCLowThreshold, "image-gc-low-threshold", cfg.ImageGCLowThreshold, "disk usage percent image GC frees down to")
	fs.Var(durationValue{&cfg.MinimumImageTTL}, "minimum-image-ttl-duration", "minimum age of an image, from first seen, before GC may delete it")
	fs.Var(durationValue{&cfg.ImageMaximumGCAge}, "image-maximum-gc-age", "delete images unused for longer than this, whatever the disk (0 = off)")
	fs.StringVar(&cfg.SandboxImage, "sandbox-image", cfg.SandboxImage, "pause image never to delete (also learned from CRI)")
	fs.Var(stringList{&cfg.KeepImages}, "keep-image", "glob on image names never to delete (repeatable)")
	fs.Var(durationValue{&cfg.RegretWindow}, "regret-window", "an image image GC deleted that comes back within this is reported as image.regretted")
	fs.Var(durationValue{&cfg.DiskInterval}, "disk-interval", "how often the image filesystem is sampled")
	fs.Var(durationValue{&cfg.MinimumContainerTTL}, "minimum-container-ttl-duration", "how long a dead container is kept after it exits")
	fs.Var(durationValue{&cfg.UncollectedExitGrace}, "uncollected-exit-grace", "how long a plain container's exit waits for its client to collect it")
	fs.IntVar(&cfg.MaxDeadPerContainer, "maximum-dead-containers-per-container", cfg.MaxDeadPerContainer, "dead CRI containers kept per pod container (-1 = no limit; plain containers go by their TTL)")
	fs.IntVar(&cfg.MaxDeadContainers, "maximum-dead-containers", cfg.MaxDeadContainers, "dead containers kept on the node (-1 = no limit)")
	fs.StringVar(&cfg.PruneContainers, "prune-containers", cfg.PruneContainers, "which dead containers to remove: native, all or off")
	fs.StringVar(&cfg.NerdctlDataRoot, "nerdctl-data-root", cfg.NerdctlDataRoot, "nerdctl's --data-root: the state of a removed nerdctl container is cleaned there; one whose state lies elsewhere is kept")
	fs.StringVar(&cfg.LogDir, "log-dir", cfg.LogDir, "container log symlink directory")
	fs.StringVar(&cfg.PodLogDir, "pod-log-dir", cfg.PodLogDir, "pod log directory")
	fs.StringVar(&cfg.HostPodLogDir, "host-pod-log-dir", cfg.HostPodLogDir, "the pod log directory's path on the host, which the kubelet's log links point into, when it is mounted at --pod-log-dir (default: the same)")
	fs.Var(durationValue{&cfg.PodLogGrace}, "pod-log-grace", "how long a pod must be gone before its log dir is removed")
	fs.Var(durationValue{&cfg.KubeletStatusLag}, "kubelet-status-lag", "how long a pod container's previous attempt is kept after the next one dies, while the kubelet's pod status may still name it (kubectl logs --previous), unless a newer attempt started")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "where the journal, snapshots and NATS outbox live")
	fs.Var(durationValue{&cfg.ResyncInterval}, "resync-interval", "period of full listings of containerd")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "node name in NATS subjects and events")
	natsClientFlags(fs, cfg) // --nats-url (empty: embedded server), auth, --cluster, --nats-stream
	fs.StringVar(&cfg.EmbeddedNATSListen, "embedded-nats-listen", cfg.EmbeddedNATSListen, "listen address of the embedded NATS server")
	fs.Var(byteSizeValue{&cfg.EmbeddedNATSMaxStore}, "embedded-nats-max-store", "bound of the embedded NATS server's JetStream store and stream (bytes, or 256MiB, 1GiB)")
	fs.Var(durationValue{&cfg.EmbeddedNATSMaxAge}, "embedded-nats-max-age", "how long the embedded NATS server's stream keeps events")
	fs.BoolVar(&cfg.NATSNoCreateStream, "nats-no-create-stream", cfg.NATSNoCreateStream, "use the stream as it is instead of creating or updating it")
	fs.Var(byteSizeValue{&cfg.OutboxMaxBytes}, "outbox-max-bytes", "bound of the local outbox of unacked events (bytes, or 256MiB, 1GiB)")
	fs.Var(durationValue{&cfg.OutboxMaxAge}, "outbox-max-age", "unacked events older than this are dropped (and logged)")
	fs.Var(durationValue{&cfg.HeartbeatInterval}, "heartbeat-interval", "period of agent.heartbeat events")
	fs.BoolVar(&cfg.AllowRemoteGC, "allow-remote-gc", cfg.AllowRemoteGC, "let NATS control requests run GC")
	fs.BoolVar(&cfg.Profiling, "profiling", cfg.Profiling, "serve Go's profiles (heap, CPU) under /debug/pprof/ on the metrics address; without it allocations are not sampled")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "address of /metrics, /healthz, /readyz and /status")
	fs.BoolVar(&cfg.DryRun, "dry-run", cfg.DryRun, "plan, log and publish, but delete nothing")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "json or console")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.KubeletConfig, "kubelet-config", cfg.KubeletConfig, "the node's KubeletConfiguration file (e.g. /var/lib/kubelet/config.yaml): its image GC thresholds and ages are the defaults here; its own image GC and eviction thresholds are checked")
	return fs
}

// runHelp and planHelp are the help of `gcagent run` and `gcagent plan`.
var (
	runHelp = help{Usage: "gcagent run [flags]", Env: "all",
		About: "Runs the agent: follows containerd's events, keeps the persisted projection of\n" +
			"images, containers and pods, and cleans what its policy names."}
	planHelp = help{Usage: "gcagent plan [flags] [--json]", Env: "all",
		About: "Prints what the agent would delete now and why, and the policy in force;\n" +
			"deletes nothing. A running agent (found at --metrics-address) is asked for\n" +
			"its own plan; without one, plan reads the agent's state, or applies the\n" +
			"agent's first-start rule, and says which. It takes run's flags, environment\n" +
			"and config file, so that it judges by the same policy, plus --json."}
)

// parseRun parses `gcagent run` (or plan) arguments, the environment and
// the config file into a validated agent.Config whose Sources say where
// each setting came from.
func parseRun(args []string, env func(string) string, h help, stdout io.Writer) (agent.Config, error) {
	cfg := agent.DefaultConfig()
	fs := runFlags(strings.Fields(h.Usage)[1], &cfg)
	if err := parseFlags(fs, args, h, stdout, 0); err != nil {
		return cfg, err
	}
	cfg.Sources = map[string]string{}
	fs.Visit(func(f *flag.Flag) { cfg.Sources[f.Name] = "flag" })
	file := fs.Lookup("config").Value.String()
	if file == "" {
		file = env("GCAGENT_CONFIG")
	}
	if file != "" {
		kv, err := readConfigFile(file)
		if err != nil {
			return cfg, usageError{err}
		}
		for _, e := range kv {
			if cfg.Sources[e.name] == "flag" || env(envName(e.name)) != "" {
				continue
			}
			from := fmt.Sprintf("%s:%d", file, e.line)
			if err := setFlag(fs, e.name, e.value, from); err != nil {
				return cfg, usageError{err}
			}
			cfg.Sources[e.name] = "file " + from
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v := env(envName(f.Name)); v != "" && cfg.Sources[f.Name] != "flag" && f.Name != "config" && err == nil {
			err = setFlag(fs, f.Name, v, envName(f.Name))
			cfg.Sources[f.Name] = "env " + envName(f.Name)
		}
	})
	if err != nil {
		return cfg, usageError{err}
	}
	// The kubelet's values fill what no flag, variable or file line set.
	if err := cfg.AdoptKubelet(); err != nil {
		return cfg, usageError{err}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
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

// setting is one `name = value` line of a config file.
type setting struct {
	name, value string
	line        int
}

// readConfigFile reads `name = value` lines; # starts a comment.
func readConfigFile(file string) ([]setting, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	var out []setting
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
		out = append(out, setting{strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`), n})
	}
	return out, sc.Err()
}
