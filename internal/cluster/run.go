package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/workload"
)

// KeepReplicas is how many replicas the keep list's bucket gets when the
// component makes it (a clustered JetStream takes 3). Set by the CLI.
var KeepReplicas = 1

// Run runs the component until ctx ends: the informers (on every replica)
// and the endpoints, and while this replica leads, keep-sync's publisher
// and the Events bridge. It returns an error only for what it cannot start
// with (an unreadable kubeconfig, an address it cannot listen on); the API
// server and NATS being away are waited out.
func Run(ctx context.Context, cfg Config, log zerolog.Logger) error {
	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "gcagent-cluster/" + version.Version
	restCfg.QPS, restCfg.Burst = 50, 100
	// Protobuf lists decode several times faster than JSON: the first
	// sync of 50,000 pods is the component's peak.
	restCfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	// Events have a client of their own: their bursts (a fleet's GC wave)
	// must not wait behind the informers' rate, nor slow the Lease's
	// renewals.
	evCfg := rest.CopyConfig(restCfg)
	evCfg.QPS, evCfg.Burst = 250, 500
	eventsClient, err := kubernetes.NewForConfig(evCfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddress)
	if err != nil {
		return fmt.Errorf("--metrics-address %s: %w", cfg.MetricsAddress, err)
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, cfg.Kinds)
	c := clock.System(nil)
	log.Info().Str("version", version.Version).Str("cluster", cfg.Cluster).Strs("kinds", cfg.Kinds).Strs("namespaces", cfg.Namespaces).
		Float64("release_after_s", cfg.ReleaseAfter.Seconds()).Bool("events", cfg.Events).Str("identity", cfg.Identity).Msg("gcagent-cluster starting")

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(strip))
	ks := newKeepSync(cfg, c, m, log)
	if err := ks.start(ctx, client, factory); err != nil {
		return err
	}
	nodes := factory.Core().V1().Nodes()
	if cfg.Events {
		_ = nodes.Informer() // made before Start
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	nopts := cfg.NATS
	nopts.Logger, nopts.Cluster, nopts.Node = log, cfg.Cluster, "cluster-"+cfg.Identity
	nc, err := natsbus.Connect(nopts)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	var leading atomic.Bool
	mux := handler(reg, ks, nc.IsConnected, &leading)
	if cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	lead := func(ctx context.Context) error {
		leading.Store(true)
		m.leader.Set(1)
		defer func() { leading.Store(false); m.leader.Set(0) }()
		kv, err := waitBucket(ctx, js, log)
		if err != nil {
			return err
		}
		g, gctx := errgroup.WithContext(ctx)
		pub := newPublisher(cfg, kv, ks, c, m, log)
		pub.ensure = func(ctx context.Context) (jetstream.KeyValue, error) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return ensureKeepBucket(ctx, js, KeepReplicas)
		}
		g.Go(func() error { return pub.run(gctx) })
		if cfg.Events {
			if !cacheSynced(gctx, nodes.Informer().HasSynced) {
				return gctx.Err()
			}
			b := newBridge(cfg, js, nodes.Lister(), &eventsSink{client: eventsClient.EventsV1(), m: m}, c, m, log)
			g.Go(func() error { return retry(gctx, log, "events bridge", b.run) })
		}
		return g.Wait()
	}
	if !cfg.LeaderElection {
		err := lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	return elect(ctx, cfg, client, log, lead)
}

// elect campaigns for the Lease until ctx ends, and runs lead while this
// replica holds it. A lead that fails gives the Lease up; the replica
// campaigns again after a pause.
func elect(ctx context.Context, cfg Config, client kubernetes.Interface, log zerolog.Logger, lead func(context.Context) error) error {
	log = log.With().Str("component", "leader-election").Logger()
	for ctx.Err() == nil {
		round, cancel := context.WithCancel(ctx)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metaName(cfg.LeaseNamespace, cfg.LeaseName),
				Client:     client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
			},
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			ReleaseOnCancel: true, Name: "gcagent-cluster",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					log.Info().Str("lease", cfg.LeaseNamespace+"/"+cfg.LeaseName).Msg("leading: publishing the cluster keep list and bridging Events")
					if err := lead(lctx); err != nil && lctx.Err() == nil {
						log.Warn().Err(err).Msg("giving up the lead")
					}
					cancel()
				},
				OnStoppedLeading: func() { log.Info().Msg("not leading") },
				OnNewLeader: func(id string) {
					if id != cfg.Identity {
						log.Info().Str("leader", id).Msg("another replica leads")
					}
				},
			},
		})
		if err != nil {
			cancel()
			return err
		}
		le.Run(round)
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a pod: %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// strip is the informers' transform: workload.Strip, and a Node reduced to
// its name and uid (a Node's status lists every image it holds).
func strip(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		out := &corev1.Node{}
		out.Name, out.UID, out.ResourceVersion = n.Name, n.UID, n.ResourceVersion
		return out, nil
	}
	return workload.Strip(obj)
}

// waitBucket returns the keep list's bucket once NATS answers.
func waitBucket(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, log, "keep list bucket", func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		kv, err = ensureKeepBucket(cctx, js, KeepReplicas)
		return err
	})
	return kv, err
}

// retry runs f until it returns nil or ctx ends, waiting 1 s and up to 30 s
// between tries, and logs each new error once.
func retry(ctx context.Context, log zerolog.Logger, what string, f func(context.Context) error) error {
	wait, last := time.Second, ""
	for {
		err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errOtherWriter) {
			return err
		}
		if err.Error() != last {
			log.Warn().Err(err).Str("what", what).Msg("failed; trying again")
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// cacheSynced waits for synced, or ctx's end (false).
func cacheSynced(ctx context.Context, synced func() bool) bool {
	for !synced() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return true
}

// handler serves /metrics, /healthz (the process serves) and /readyz
// (informers synced and NATS connected; one line per part either way).
func handler(reg *prometheus.Registry, ks *keepSync, natsUp func() bool, leading *atomic.Bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		state, reason := ks.state()
		var lines []string
		ok := true
		if state == "syncing" {
			ok = false
		}
		lines = append(lines, "keep list: "+string(state)+optional(reason))
		lines = append(lines, ks.kindLines()...)
		if natsUp() {
			lines = append(lines, "nats: connected")
		} else {
			ok = false
			lines = append(lines, "nats: not connected")
		}
		if leading.Load() {
			lines = append(lines, "leader: this replica")
		} else {
			lines = append(lines, "leader: another replica (standby)")
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(strings.Join(lines, "\n") + "\n"))
	})
	return mux
}

func optional(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func metaName(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
