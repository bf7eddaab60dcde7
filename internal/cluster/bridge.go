package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/nodeevents"
)

// Component and controller names of the Events the bridge writes.
const (
	eventSource     = "gcagent"
	eventController = "gcagent.io/gcagent"
)

// bridge reads the agents' actions from the fleet's event stream, while
// this replica leads, and records what nodeevents makes of them on their
// Node through client-go's event recorder: its correlator combines a
// burst of similar events into one with a count and rate-limits each node
// and reason (a token bucket), so that a thousand removals are a few
// Events, never a storm. Events are best effort, as the kubelet's are: one
// the API server does not take is retried by the recorder, then dropped
// and counted; the NATS message is acknowledged once recorded.
type bridge struct {
	cfg   Config
	js    jetstream.JetStream
	nodes corelisters.NodeLister
	clock clock.Timers
	log   zerolog.Logger
	m     *metrics

	started     time.Time // when the process started (the consumer's start, once)
	broadcaster record.EventBroadcaster
	mu          sync.Mutex
	recorders   map[string]record.EventRecorder // by node
}

func newBridge(cfg Config, js jetstream.JetStream, nodes corelisters.NodeLister, sink record.EventSink, c clock.Timers, m *metrics, log zerolog.Logger) *bridge {
	b := &bridge{cfg: cfg, js: js, nodes: nodes, clock: c, m: m, log: log.With().Str("component", "events").Logger(),
		recorders: map[string]record.EventRecorder{}, started: processStart}
	b.broadcaster = record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{
		BurstSize: cfg.EventBurst, QPS: float32(1 / cfg.EventRefill.Seconds()), MaxEvents: cfg.EventAggregate,
		// Each reason of a node has its budget: a burst of removals does not
		// silence the pass that summarises them.
		SpamKeyFunc: func(e *corev1.Event) string {
			return strings.Join([]string{e.Source.Host, e.InvolvedObject.Name, string(e.InvolvedObject.UID), e.Type, e.Reason}, "\x00")
		},
	}))
	b.broadcaster.StartRecordingToSink(sink)
	return b
}

// processStart is when this process started.
var processStart = time.Now()

// consumerName is the durable consumer of cluster's events: one for the
// component, whichever replica leads.
func consumerName(cluster string) string { return "gcagent-cluster-" + cluster }

// replayBefore is how much of the stream before the component's start a
// first install bridges: what the agents did while it was being rolled
// out, not a day of history.
const replayBefore = time.Minute

// run bridges until ctx ends. The durable consumer, made the first time,
// starts a minute before this process started (a first install does not
// replay a day of history into Events, nor lose what the agents did while
// the stream or the component were coming up); after that every leader
// resumes where the last one acknowledged.
func (b *bridge) run(ctx context.Context) error {
	cons, err := b.js.Consumer(ctx, b.cfg.EventStream, consumerName(b.cfg.Cluster))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		from := b.started.Add(-replayBefore)
		cons, err = b.js.CreateConsumer(ctx, b.cfg.EventStream, jetstream.ConsumerConfig{
			Durable: consumerName(b.cfg.Cluster), Description: "gcagent-cluster: the agents' actions as Kubernetes Events",
			FilterSubject: natsbus.EventPrefix + "." + b.cfg.Cluster + ".>", DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 4096,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = b.js.Consumer(ctx, b.cfg.EventStream, consumerName(b.cfg.Cluster))
		}
	}
	if err != nil {
		return fmt.Errorf("events consumer on %s: %w", b.cfg.EventStream, err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		b.handle(msg.Data())
		_ = msg.Ack()
	}, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("events consumer: %w", err)
	}
	defer cc.Stop()
	b.log.Info().Str("stream", b.cfg.EventStream).Str("consumer", consumerName(b.cfg.Cluster)).Msg("bridging the agents' actions to Events on their Nodes")
	t := b.clock.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if info, err := cons.Info(cctx); err == nil {
			b.m.eventsPending.Set(float64(info.NumPending + uint64(info.NumAckPending)))
		}
		cancel()
		t.Reset(5 * time.Second)
	}
}

// handle records the Event one agent action becomes, if any.
func (b *bridge) handle(data []byte) {
	var ev natsbus.CloudEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		b.skip("undecodable", err)
		return
	}
	e, ok, err := nodeevents.Map(ev)
	switch {
	case err != nil:
		b.skip("undecodable", err)
		return
	case !ok:
		return
	}
	b.m.eventsLag.Set(b.clock.Now().Sub(e.Time).Seconds())
	node, err := b.nodes.Get(e.Node)
	if apierrors.IsNotFound(err) {
		b.skip("unknown-node", fmt.Errorf("node %q is not in the cluster", e.Node))
		return
	}
	if err != nil {
		b.skip("unknown-node", err)
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID}
	b.recorder(e.Node).Event(ref, e.Type, e.Reason, e.Note)
	b.m.eventsReceived.WithLabelValues(e.Reason).Inc()
}

func (b *bridge) skip(cause string, err error) {
	b.m.eventsSkipped.WithLabelValues(cause).Inc()
	b.log.Debug().Err(err).Str("cause", cause).Msg("an agent's action not shown as an Event")
}

func (b *bridge) recorder(node string) record.EventRecorder {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.recorders[node]
	if r == nil {
		r = b.broadcaster.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: eventSource, Host: node})
		b.recorders[node] = r
	}
	return r
}

// stop ends the recorder's goroutines.
func (b *bridge) stop() { b.broadcaster.Shutdown() }
