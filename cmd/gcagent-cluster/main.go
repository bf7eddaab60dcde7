// Command gcagent-cluster is gcagent's cluster-side component: it keeps
// the fleet keep list's cluster key from the workloads the cluster
// declares, and shows what the agents do as Kubernetes Events on their
// Node. It reads the API server with informers and speaks to the agents
// only through the fleet's NATS, so that nodes keep no API credentials.
// A second binary, so that the node's agent links no API client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gcagent/gcagent/internal/cluster"
	"github.com/gcagent/gcagent/internal/suggest"
	"github.com/gcagent/gcagent/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := execute(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gcagent-cluster: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a bad command line or variable: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }

// envPrefix starts the variable of every flag: GCAGENT_CLUSTER_NATS_URL
// for --nats-url.
const envPrefix = "GCAGENT_CLUSTER_"

func execute(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg := cluster.DefaultConfig()
	replicas := 1
	cmd := &cobra.Command{
		Use:   "gcagent-cluster",
		Short: "keep the images the cluster's workloads declare, and show GC as Events on the Nodes",
		Long: "gcagent-cluster reads the API server (informers, read-only) and writes, while it leads (a Lease),\n" +
			"the images every declared workload names to the fleet keep list's cluster key on NATS, which every\n" +
			"agent of the cluster merges with the operator's own; and it records the agents' removals, shortfalls,\n" +
			"failures and regrets as Events on their Node. Every flag also reads " + envPrefix + "<FLAG>.",
		Version:       version.Version + " (" + version.Commit + ")",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.NoArgs(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fromEnv(cmd.Flags(), environ); err != nil {
				return usageError{err}
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			if cfg.Kubeconfig != "" {
				if _, err := os.Stat(cfg.Kubeconfig); err != nil {
					return usageError{fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, err)}
				}
			}
			cluster.KeepReplicas = replicas
			log := newLogger(cfg.LogFormat, stderr)
			cluster.RouteKlog(log)
			return cluster.Run(ctx, cfg, log)
		},
	}
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	f := cmd.Flags()
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if typed, ok := strings.CutPrefix(err.Error(), "unknown flag: "); ok {
			err = fmt.Errorf("%w%s", err, suggest.DidYouMean(typed, flagNames(f, "--")))
		}
		return usageError{err}
	})
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", cfg.Kubeconfig, "kubeconfig file (empty: the pod's service account)")
	f.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "the cluster's name in NATS: the agents' --cluster")
	f.StringVar(&cfg.NATS.URL, "nats-url", "", "the fleet's NATS (required): the server the agents read the keep list from")
	f.StringVar(&cfg.NATS.CredsFile, "nats-creds", "", "NATS credentials file (allowed to write the keep list's bucket and consume the event stream)")
	f.StringVar(&cfg.NATS.NkeyFile, "nats-nkey", "", "NATS nkey seed file")
	f.StringVar(&cfg.NATS.User, "nats-user", "", "NATS user")
	f.StringVar(&cfg.NATS.Password, "nats-password", "", "NATS password")
	f.StringVar(&cfg.NATS.Token, "nats-token", "", "NATS token")
	f.StringVar(&cfg.NATS.TLSCA, "nats-tls-ca", "", "CA file of the NATS server's certificate")
	f.StringVar(&cfg.NATS.TLSCert, "nats-tls-cert", "", "client certificate for NATS mutual TLS")
	f.StringVar(&cfg.NATS.TLSKey, "nats-tls-key", "", "client key for NATS mutual TLS")
	f.IntVar(&replicas, "keep-replicas", replicas, "replicas of the keep list's bucket when this makes it (3 on a clustered JetStream)")
	f.StringVar(&cfg.EventStream, "events-stream", cfg.EventStream, "the agents' event stream")
	f.StringSliceVar(&cfg.Kinds, "kinds", cfg.Kinds, "the kinds whose workloads declare images (each needs list and watch in RBAC)")
	f.StringSliceVar(&cfg.Namespaces, "namespace", cfg.Namespaces, `namespaces whose workloads count, or "*" for every one`)
	f.StringSliceVar(&cfg.ExcludeNamespaces, "exclude-namespace", cfg.ExcludeNamespaces, "namespaces that never count")
	f.DurationVar(&cfg.ReleaseAfter, "release-after", cfg.ReleaseAfter, "how long an image stays kept after the last workload naming it stops")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", cfg.Heartbeat, "how often the leader says it is alive (agents call the list stale after three missed)")
	f.BoolVar(&cfg.Events, "events", cfg.Events, "record the agents' actions as Events on their Node")
	f.IntVar(&cfg.EventBurst, "event-burst", cfg.EventBurst, "Events a node may get per reason in a burst (client-go's spam filter)")
	f.DurationVar(&cfg.EventRefill, "event-refill", cfg.EventRefill, "after a burst, one more Event per node and reason this often")
	f.IntVar(&cfg.EventAggregate, "event-aggregate", cfg.EventAggregate, "similar Events of a node and reason within 10 minutes written as they are before they are combined into one with a count")
	f.BoolVar(&cfg.LeaderElection, "leader-election", cfg.LeaderElection, "elect a leader among the replicas (a coordination.k8s.io Lease); off: this one leads")
	f.StringVar(&cfg.LeaseNamespace, "lease-namespace", cfg.LeaseNamespace, "namespace of the election's Lease")
	f.StringVar(&cfg.LeaseName, "lease-name", cfg.LeaseName, "name of the election's Lease")
	f.StringVar(&cfg.Identity, "identity", cfg.Identity, "this replica's name in the election (the pod's name)")
	f.StringVar(&cfg.MetricsAddress, "metrics-address", cfg.MetricsAddress, "where /metrics, /healthz and /readyz are served")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "json or console")
	f.BoolVar(&cfg.Profiling, "profiling", cfg.Profiling, "serve Go's /debug/pprof/ on --metrics-address")
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// fromEnv sets every flag not given on the command line from its variable.
func fromEnv(fs *pflag.FlagSet, environ []string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, envPrefix) {
			env[k] = v
		}
	}
	var errs []error
	known := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		known[name] = true
		v, ok := env[name]
		if !ok || f.Changed {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s %q: %w", name, v, err))
		}
	})
	for k := range env {
		if !known[k] {
			errs = append(errs, fmt.Errorf("unknown variable %s%s", k, suggest.DidYouMean(k, slices.Sorted(maps.Keys(known)))))
		}
	}
	return errors.Join(errs...)
}

// flagNames are the names of fs's flags, each after prefix.
func flagNames(fs *pflag.FlagSet, prefix string) []string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, prefix+f.Name) })
	return names
}

func newLogger(format string, w io.Writer) zerolog.Logger {
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).With().Timestamp().Str("component", "gcagent-cluster").Logger()
}
