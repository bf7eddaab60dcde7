package main

import (
	"bufio"
	"errors"
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

// runFlags binds the flags of `gcagent run` to cfg.
func runFlags(cfg *agent.Config) *flag.FlagSet {
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
// file into a validated agent.Config.
func parseRun(args []string, env func(string) string, stderr io.Writer) (agent.Config, error) {
	cfg := agent.DefaultConfig()
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
