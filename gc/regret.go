package gc

import (
	"context"
	"errors"
	"fmt"
	"github.com/gcagent/gcagent/internal/promzero"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
)

// DefaultRegretWindow is how long after a delete the return of an image
// counts as a regret.
const DefaultRegretWindow = 24 * time.Hour

// Recorder journals an event in namespace ns's projection (the agent
// sends it to the projection's input). It fails only when ctx ends first.
type Recorder func(ctx context.Context, ns string, ev events.Event) error

// RegretReporter publishes image.regretted once for each deletion of this
// agent's image GC whose image came back within the regret window (the
// projection notices the return: projection.Deletion), counts it, and
// journals that it was reported. One goroutine (Run) owns it.
type RegretReporter struct {
	proj    imageProjection
	changes <-chan struct{}
	pub     Publisher
	record  Recorder
	now     func() time.Time
	log     zerolog.Logger
	// sent are the reports published whose RegretReported is not yet
	// applied, so a change meanwhile does not publish them again.
	sent        map[string]bool
	regrets     *prometheus.CounterVec
	regretBytes *prometheus.CounterVec
}

// NewRegretReporter subscribes to the projection (call it before the
// projection runs) and registers its metrics on reg (nil: none), with a
// zero series for each of namespaces (the managed ones known at start).
func NewRegretReporter(proj imageProjection, pub Publisher, record Recorder, now func() time.Time, log zerolog.Logger,
	reg prometheus.Registerer, namespaces ...string) (*RegretReporter, error) {
	if proj == nil || pub == nil || record == nil {
		return nil, errors.New("regret reporter: a projection, a publisher and a recorder are required")
	}
	r := &RegretReporter{proj: proj, changes: proj.Subscribe(), pub: pub, record: record, now: now, log: log, sent: map[string]bool{},
		regrets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_regret_total", Help: "Images image GC deleted that came back on the node within the regret window, by containerd namespace.",
		}, []string{"namespace"}),
		regretBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_regret_bytes_total", Help: "Bytes (image sizes) of the deleted images that came back within the regret window, by containerd namespace.",
		}, []string{"namespace"}),
	}
	promzero.Labels(r.regrets.WithLabelValues, namespaces)
	promzero.Labels(r.regretBytes.WithLabelValues, namespaces)
	if reg != nil {
		for _, c := range []prometheus.Collector{r.regrets, r.regretBytes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("regret metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run reports regrets at start and after every projection change until
// ctx ends; it returns nil then.
func (r *RegretReporter) Run(ctx context.Context) error {
	for {
		r.Report(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-r.changes:
		}
	}
}

type nsRegret struct {
	ns string
	d  projection.Deletion
}

// Report publishes the regrets not reported yet and returns how many it
// published. A publish that fails is retried on the next change.
func (r *RegretReporter) Report(ctx context.Context) int {
	var todo []nsRegret
	live := map[string]bool{}
	r.proj.ViewAll(func(states []*projection.State) {
		for _, s := range states {
			for _, d := range s.Regrets() {
				k := regretKey(s.Namespace, d)
				live[k] = true
				if !r.sent[k] {
					todo = append(todo, nsRegret{s.Namespace, d})
				}
			}
		}
	})
	for k := range r.sent {
		if !live[k] {
			delete(r.sent, k) // its RegretReported is applied
		}
	}
	n := 0
	for _, it := range todo {
		d, k := it.d, regretKey(it.ns, it.d)
		after := d.ReturnedAt.Sub(d.At)
		data := schema.ImageRegret{Namespace: it.ns, Digest: d.Digest, Names: d.Names, ReturnedAs: d.ReturnedAs,
			DeletedAt: d.At, ReturnedAt: d.ReturnedAt, ReturnAfterSeconds: max(after.Seconds(), 0), Bytes: d.Size,
			FreedBytes: d.Freed, Rule: schema.Reason(d.Rule), Trigger: d.Trigger}
		if err := r.pub.Publish(Action{Kind: schema.KindImage, Action: schema.ActionRegretted, Subject: d.Digest, Key: k, Data: data}); err != nil {
			r.log.Warn().Err(err).Str("digest", d.Digest).Msg("publish image.regretted failed; retried on the next change")
			continue
		}
		r.sent[k] = true
		n++
		r.regrets.WithLabelValues(it.ns).Inc()
		r.regretBytes.WithLabelValues(it.ns).Add(float64(d.Size))
		r.log.Info().Str("namespace", it.ns).Str("image", firstName(d.Names)).Str("digest", d.Digest).Strs("names", d.Names).
			Str("returned_as", d.ReturnedAs).Time("deleted_at", d.At).Float64("return_after_s", after.Seconds()).
			Int64("size_bytes", d.Size).Int64("freed_bytes", d.Freed).Str("rule", d.Rule).Str("trigger", d.Trigger).
			Msg("image regretted: it came back after image gc deleted it")
		if err := r.record(ctx, it.ns, events.RegretReported{At: r.now(), Digest: d.Digest, Deleted: d.At}); err != nil {
			return n // stopping: the journal has no mark, the next start publishes it again under the same id
		}
	}
	return n
}

// regretKey identifies one deletion's regret (the event's key).
func regretKey(ns string, d projection.Deletion) string {
	return "regret/" + ns + "/" + d.Digest + "/" + strconv.FormatInt(d.At.UnixNano(), 10)
}
