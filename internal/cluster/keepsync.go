package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/workload"
)

// keepSync follows the informers of every kind that counts into one
// declared.Set. Every replica runs it (the standby is synced when it
// takes over); only the leader publishes what it holds.
type keepSync struct {
	cfg   Config
	clock clock.Timers
	log   zerolog.Logger
	m     *metrics

	changed chan struct{} // a change to publish (capacity 1)

	mu    sync.Mutex
	set   *declared.Set
	kinds []*kindState
}

// kindState is what keep-sync knows of one kind's informer.
type kindState struct {
	kind     workload.Kind
	informer cache.SharedIndexInformer
	rest     rest.Interface // its group's client, for a probe
	// err is the last list or watch error, at errAt; okAt the last sign the
	// kind can be read since (an event, a probe that listed).
	err        string
	errAt      time.Time
	okAt       time.Time
	probing    bool
	everSynced bool
}

func newKeepSync(cfg Config, c clock.Timers, m *metrics, log zerolog.Logger) *keepSync {
	return &keepSync{cfg: cfg, clock: c, m: m, log: log.With().Str("component", "keep-sync").Logger(),
		changed: make(chan struct{}, 1), set: declared.NewSet()}
}

// start makes the informers of cfg.Kinds on factory (which must strip
// objects: workload.Strip) and registers the handlers; the caller starts
// the factory.
func (k *keepSync) start(ctx context.Context, client kubernetes.Interface, f informers.SharedInformerFactory) error {
	for _, res := range k.cfg.Kinds {
		kind, _ := workload.KindOf(res)
		ks := &kindState{kind: kind}
		switch res {
		case "pods":
			ks.informer, ks.rest = f.Core().V1().Pods().Informer(), client.CoreV1().RESTClient()
		case "deployments":
			ks.informer, ks.rest = f.Apps().V1().Deployments().Informer(), client.AppsV1().RESTClient()
		case "replicasets":
			ks.informer, ks.rest = f.Apps().V1().ReplicaSets().Informer(), client.AppsV1().RESTClient()
		case "statefulsets":
			ks.informer, ks.rest = f.Apps().V1().StatefulSets().Informer(), client.AppsV1().RESTClient()
		case "daemonsets":
			ks.informer, ks.rest = f.Apps().V1().DaemonSets().Informer(), client.AppsV1().RESTClient()
		case "controllerrevisions":
			ks.informer, ks.rest = f.Apps().V1().ControllerRevisions().Informer(), client.AppsV1().RESTClient()
		case "jobs":
			ks.informer, ks.rest = f.Batch().V1().Jobs().Informer(), client.BatchV1().RESTClient()
		case "cronjobs":
			ks.informer, ks.rest = f.Batch().V1().CronJobs().Informer(), client.BatchV1().RESTClient()
		default:
			return fmt.Errorf("kind %q has no informer", res)
		}
		if err := ks.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			k.failed(ctx, ks, err)
		}); err != nil {
			return err
		}
		if _, err := ks.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k.put(ks, obj) },
			UpdateFunc: func(_, obj any) { k.put(ks, obj) },
			DeleteFunc: func(obj any) { k.remove(ks, obj) },
		}); err != nil {
			return err
		}
		k.kinds = append(k.kinds, ks)
	}
	return nil
}

func (k *keepSync) put(ks *kindState, obj any) {
	d, ok := workload.Of(obj)
	if !ok || !k.cfg.counts(d.Workload.Namespace) {
		return
	}
	now := k.clock.Now()
	k.mu.Lock()
	ks.okAt = now
	changed := k.set.Put(d.Workload, d.Images, now)
	k.mu.Unlock()
	if len(d.Invalid) > 0 {
		k.m.invalidRefs.Add(float64(len(d.Invalid)))
		k.log.Debug().Str("workload", d.Workload.String()).Strs("invalid", d.Invalid).Msg("references that name no image, left out")
	}
	if changed {
		k.nudge()
	}
}

func (k *keepSync) remove(ks *kindState, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	d, ok := workload.Of(obj)
	if !ok {
		return
	}
	now := k.clock.Now()
	k.mu.Lock()
	ks.okAt = now
	changed := k.set.Delete(d.Workload, now)
	k.mu.Unlock()
	if changed {
		k.nudge()
	}
}

func (k *keepSync) nudge() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// failed records a list or watch error of ks's informer (RBAC denies the
// kind, the API server is down) and probes the kind until it can be read
// again: until then the list is not complete.
func (k *keepSync) failed(ctx context.Context, ks *kindState, err error) {
	now := k.clock.Now()
	k.m.kindErrors.WithLabelValues(ks.kind.Resource).Inc()
	k.mu.Lock()
	first := ks.err == "" || !ks.okAt.Before(ks.errAt)
	ks.err, ks.errAt = err.Error(), now
	probe := !ks.probing
	ks.probing = true
	k.mu.Unlock()
	if first {
		k.log.Warn().Str("kind", ks.kind.Resource).Err(err).Msg("cannot read a kind: the cluster keep list is not complete until it can")
	}
	k.nudge()
	if probe {
		go k.probe(ctx, ks)
	}
}

// probe lists one object of ks's kind every few seconds until a list
// succeeds after the last error: then the kind counts as readable again.
func (k *keepSync) probe(ctx context.Context, ks *kindState) {
	defer func() {
		k.mu.Lock()
		ks.probing = false
		k.mu.Unlock()
	}()
	t := k.clock.NewTimer(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := ks.rest.Get().Resource(ks.kind.Resource).VersionedParams(&metav1.ListOptions{Limit: 1}, scheme.ParameterCodec).Do(cctx).Error()
		cancel()
		if err == nil {
			k.mu.Lock()
			ks.okAt = k.clock.Now()
			k.mu.Unlock()
			k.log.Info().Str("kind", ks.kind.Resource).Msg("a kind can be read again")
			k.nudge()
			return
		}
		t.Reset(5 * time.Second)
	}
}

// state says what the list is now: syncing while a kind has not synced
// since start (and reads no error), incomplete while a kind's last error
// is newer than the last sign it can be read, else complete.
func (k *keepSync) state() (declared.State, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var failing, waiting []string
	for _, ks := range k.kinds {
		synced := ks.informer.HasSynced()
		if synced && !ks.everSynced {
			ks.everSynced = true
		}
		k.m.kindSynced.WithLabelValues(ks.kind.Resource).Set(b2f(synced))
		switch {
		case ks.err != "" && !ks.okAt.After(ks.errAt):
			failing = append(failing, ks.kind.Resource+": "+ks.err)
		case !synced:
			waiting = append(waiting, ks.kind.Resource)
		}
	}
	switch {
	case len(failing) > 0:
		sort.Strings(failing)
		return declared.Incomplete, "cannot read " + strings.Join(failing, "; ")
	case len(waiting) > 0:
		return declared.Syncing, "informers not synced yet: " + strings.Join(waiting, ", ")
	}
	return declared.Complete, ""
}

// entries returns the list; with release, the images undeclared for the
// grace are dropped first (released reports them), and next is when the
// next one will be.
func (k *keepSync) entries(now time.Time, release bool) (es []declared.Entry, released []string, next time.Time, workloads int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if release {
		released, next = k.set.Release(now, k.cfg.ReleaseAfter)
	}
	_, workloads = k.set.Len()
	return k.set.Entries(), released, next, workloads
}

// seed adds an image a previous leader published that no workload names
// now (declared.Set.Seed).
func (k *keepSync) seed(ref string, undeclared, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.set.Seed(ref, undeclared, now)
}

// kindLines are one line per kind for /readyz.
func (k *keepSync) kindLines() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, ks := range k.kinds {
		s := ks.kind.Resource + ": "
		switch {
		case ks.err != "" && !ks.okAt.After(ks.errAt):
			s += "cannot read (" + ks.err + ")"
		case ks.informer.HasSynced():
			s += "synced"
		default:
			s += "syncing"
		}
		out = append(out, s)
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
