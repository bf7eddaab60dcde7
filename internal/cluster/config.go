// Package cluster is the cluster-side component of gcagent
// (gcagent-cluster): it reads the Kubernetes API with informers and speaks
// to the agents only through the fleet's NATS, so that nodes keep no API
// credentials. Keep-sync publishes the images every declared workload
// names as the fleet keep list's cluster key (declared/); the bridge shows
// the agents' removals, shortfalls, failures and regrets as Events on their
// Node (nodeevents/). Two replicas run, one leads (a coordination.k8s.io
// Lease): both keep their informers synced, only the leader writes.
package cluster

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/workload"
)

// Config is the component's configuration.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty: the pod's own service
	// account (in-cluster). Default empty.
	Kubeconfig string
	// Cluster names the cluster in NATS: the agents' --cluster. Default
	// "default".
	Cluster string
	// NATS is how to reach the fleet's NATS (URL required) and who to be:
	// credentials allowed to write the keep list's bucket and to consume
	// the event stream.
	NATS natsbus.ConnOptions
	// EventStream is the agents' event stream. Default natsbus.DefaultStream.
	EventStream string
	// Kinds are the resources that declare images (workload.Kinds'
	// resources). Default all of them.
	Kinds []string
	// Namespaces are the namespaces whose workloads count; ["*"]: every
	// one. Default ["*"].
	Namespaces []string
	// ExcludeNamespaces never count, also under "*". Default none.
	ExcludeNamespaces []string
	// ReleaseAfter is how long an image stays on the list after the last
	// workload naming it stops (deleted, changed, out of its history).
	// Default 1h.
	ReleaseAfter time.Duration
	// Heartbeat is how often the leader rewrites the list's head, so that
	// agents see it alive; agents call the list stale after three missed.
	// Default 30s.
	Heartbeat time.Duration
	// Events turns the bridge of node actions to Kubernetes Events on.
	// Default true.
	Events bool
	// EventBurst and EventRefill rate-limit Events per node and reason
	// (client-go's spam filter: a burst, then one per refill). Default 25
	// and 5m, client-go's own.
	EventBurst  int
	EventRefill time.Duration
	// EventAggregate is how many events of one reason on one node, with
	// different notes, within 10 minutes are written as they are before
	// the rest are combined into one with a count (client-go's
	// aggregator). Default 5.
	EventAggregate int
	// LeaderElection turns leader election on (off: this replica leads
	// alone). Default true.
	LeaderElection bool
	// LeaseNamespace and LeaseName name the coordination.k8s.io Lease of
	// the election. Default the pod's namespace (POD_NAMESPACE, else
	// kube-system) and "gcagent-cluster".
	LeaseNamespace, LeaseName string
	// Identity names this replica in the election and in what it writes.
	// Default the hostname (the pod's name).
	Identity string
	// MetricsAddress serves /metrics, /healthz and /readyz. Default ":9618".
	MetricsAddress string
	// Profiling adds Go's /debug/pprof/ to MetricsAddress. Default false.
	Profiling bool
	// LogFormat is json or console. Default json.
	LogFormat string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "kube-system"
	}
	var kinds []string
	for _, k := range workload.Kinds {
		kinds = append(kinds, k.Resource)
	}
	return Config{Cluster: "default", EventStream: natsbus.DefaultStream, Kinds: kinds, Namespaces: []string{"*"},
		ReleaseAfter: time.Hour, Heartbeat: 30 * time.Second, Events: true, EventBurst: 25, EventRefill: 5 * time.Minute,
		EventAggregate: 5, LeaderElection: true, LeaseNamespace: ns, LeaseName: "gcagent-cluster", Identity: host,
		MetricsAddress: ":9618", LogFormat: "json"}
}

// Validate says what is wrong with c, one line.
func (c Config) Validate() error {
	switch {
	case c.NATS.URL == "":
		return errors.New("--nats-url is required: the fleet's NATS, which the agents read the keep list from")
	case c.Cluster == "" || natsbus.SafeToken(c.Cluster) != c.Cluster:
		return fmt.Errorf("invalid --cluster %q: want one NATS subject token (no '.', '*', '>' or spaces), the agents' --cluster", c.Cluster)
	case len(c.Kinds) == 0:
		return errors.New("--kinds: name at least one kind")
	case c.ReleaseAfter < 0:
		return fmt.Errorf("invalid --release-after %s: must not be negative", c.ReleaseAfter)
	case c.Heartbeat < time.Second:
		return fmt.Errorf("invalid --heartbeat %s: at least 1s", c.Heartbeat)
	case c.EventBurst < 1 || c.EventRefill <= 0 || c.EventAggregate < 1:
		return errors.New("--event-burst, --event-refill and --event-aggregate must be positive")
	case c.LogFormat != "json" && c.LogFormat != "console":
		return fmt.Errorf("invalid --log-format %q: want json or console", c.LogFormat)
	case c.LeaderElection && (c.LeaseNamespace == "" || c.LeaseName == "" || c.Identity == ""):
		return errors.New("leader election needs --lease-namespace, --lease-name and --identity")
	}
	for _, k := range c.Kinds {
		if _, ok := workload.KindOf(k); !ok {
			var all []string
			for _, k := range workload.Kinds {
				all = append(all, k.Resource)
			}
			return fmt.Errorf("invalid --kinds %q: want some of %s", k, strings.Join(all, ","))
		}
	}
	if len(c.Namespaces) == 0 {
		return errors.New(`--namespace: name at least one namespace, or "*"`)
	}
	if slices.Contains(c.Namespaces, "*") && len(c.Namespaces) > 1 {
		return errors.New(`--namespace: "*" stands alone`)
	}
	return nil
}

// counts says whether a workload of namespace ns counts.
func (c Config) counts(ns string) bool {
	if slices.Contains(c.ExcludeNamespaces, ns) {
		return false
	}
	return c.Namespaces[0] == "*" || slices.Contains(c.Namespaces, ns)
}
