package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// bridgeWorkers write Events in parallel, each node's on one of them (its
// events stay in order); bridgeQueue is each one's queue. A full queue
// holds the NATS consumer back: the stream keeps what is not written yet
// (pending, the consumer's backlog), nothing is dropped.
const (
	bridgeWorkers = 8
	bridgeQueue   = 256
)

// bridge reads the agents' actions from the fleet's event stream, while
// this replica leads, and records what nodeevents makes of them on their
// Node with client-go's event correlator (tools/record): it combines a
// burst of similar events into one with a count and rate-limits each node
// and reason (a token bucket), so that a thousand removals are a few
// Events, never a storm. The correlator runs here, not in client-go's
// broadcaster, whose queue drops what it cannot write in time without a
// word: each action is correlated and written before its NATS message is
// acknowledged, so a slow API server backs the stream up (counted:
// gcagent_cluster_events_pending) rather than losing Events. Events are
// best effort, as the kubelet's are: one the API server refuses after a
// few tries is dropped and counted.
type bridge struct {
	cfg   Config
	js    jetstream.JetStream
	nodes corelisters.NodeLister
	sink  record.EventSink
	clock clock.Timers
	log   zerolog.Logger
	m     *metrics

	started    time.Time // when the process started (the consumer's start, once)
	correlator *record.EventCorrelator
}

// bridged is one action to write, and its message to acknowledge after.
type bridged struct {
	event *corev1.Event
	msg   jetstream.Msg
}

func newBridge(cfg Config, js jetstream.JetStream, nodes corelisters.NodeLister, sink record.EventSink, c clock.Timers, m *metrics, log zerolog.Logger) *bridge {
	b := &bridge{cfg: cfg, js: js, nodes: nodes, sink: sink, clock: c, m: m, log: log.With().Str("component", "events").Logger(), started: processStart}
	b.correlator = record.NewEventCorrelatorWithOptions(record.CorrelatorOptions{
		BurstSize: cfg.EventBurst, QPS: float32(1 / cfg.EventRefill.Seconds()), MaxEvents: cfg.EventAggregate,
		// Each reason of a node has its budget: a burst of removals does not
		// silence the pass that summarises them.
		SpamKeyFunc: func(e *corev1.Event) string {
			return strings.Join([]string{e.Source.Host, e.InvolvedObject.Name, string(e.InvolvedObject.UID), e.Type, e.Reason}, "\x00")
		},
	})
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
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: bridgeWorkers * bridgeQueue * 2,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = b.js.Consumer(ctx, b.cfg.EventStream, consumerName(b.cfg.Cluster))
		}
	}
	if err != nil {
		return fmt.Errorf("events consumer on %s: %w", b.cfg.EventStream, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queues := make([]chan bridged, bridgeWorkers)
	done := make(chan struct{}, bridgeWorkers)
	for i := range queues {
		queues[i] = make(chan bridged, bridgeQueue)
		go func() {
			defer func() { done <- struct{}{} }()
			for it := range queues[i] {
				if it.event != nil {
					b.write(ctx, it.event)
				}
				_ = it.msg.Ack()
			}
		}()
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		ev, node := b.event(msg.Data())
		select {
		case queues[shard(node)] <- bridged{event: ev, msg: msg}:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("events consumer: %w", err)
	}
	defer func() {
		cc.Stop()
		<-cc.Closed()
		for _, q := range queues {
			close(q)
		}
		for range queues {
			<-done
		}
	}()
	b.log.Info().Str("stream", b.cfg.EventStream).Str("consumer", consumerName(b.cfg.Cluster)).Msg("bridging the agents' actions to Events on their Nodes")
	t := b.clock.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		if info, err := cons.Info(cctx); err == nil {
			b.m.eventsPending.Set(float64(info.NumPending + uint64(info.NumAckPending)))
		}
		ccancel()
		t.Reset(5 * time.Second)
	}
}

// shard is the worker of node.
func shard(node string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return int(h.Sum32() % bridgeWorkers)
}

// event is the core/v1 Event one agent action becomes (nil: none) and
// its node, as client-go's recorder makes one.
func (b *bridge) event(data []byte) (*corev1.Event, string) {
	var ce natsbus.CloudEvent
	if err := json.Unmarshal(data, &ce); err != nil {
		b.skip("undecodable", err)
		return nil, ""
	}
	e, ok, err := nodeevents.Map(ce)
	switch {
	case err != nil:
		b.skip("undecodable", err)
		return nil, ""
	case !ok:
		return nil, ""
	}
	now := b.clock.Now()
	b.m.eventsLag.Set(now.Sub(e.Time).Seconds())
	node, err := b.nodes.Get(e.Node)
	if apierrors.IsNotFound(err) {
		b.skip("unknown-node", fmt.Errorf("node %q is not in the cluster", e.Node))
		return nil, e.Node
	}
	if err != nil {
		b.skip("unknown-node", err)
		return nil, e.Node
	}
	b.m.eventsReceived.WithLabelValues(e.Reason).Inc()
	t := metav1.Time{Time: now}
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", node.Name, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
		Reason:         e.Reason, Message: e.Note, Type: e.Type, FirstTimestamp: t, LastTimestamp: t, Count: 1,
		Source: corev1.EventSource{Component: eventSource, Host: node.Name},
	}, e.Node
}

// writeTries bounds how often one Event is tried when the API server does
// not take it (it is not there, it answers 5xx): after them it is dropped
// and counted.
const writeTries = 4

// write correlates ev and writes what the correlator says: nothing (the
// node's and reason's budget is spent: counted as rate-limited), a new
// Event, or a count update of an earlier one (created again if it is gone).
func (b *bridge) write(ctx context.Context, ev *corev1.Event) {
	res, err := b.correlator.EventCorrelate(ev)
	if err != nil {
		b.skip("undecodable", err)
		return
	}
	if res.Skip {
		b.m.eventsSkipped.WithLabelValues("rate-limited").Inc()
		return
	}
	wait := 500 * time.Millisecond
	for try := 1; ; try++ {
		var out *corev1.Event
		if res.Event.Count > 1 {
			out, err = b.sink.Patch(res.Event, res.Patch)
		}
		if res.Event.Count <= 1 || apierrors.IsNotFound(err) {
			e := res.Event.DeepCopy()
			e.ResourceVersion = ""
			out, err = b.sink.Create(e)
		}
		if err == nil {
			b.correlator.UpdateState(out)
			return
		}
		var status apierrors.APIStatus
		if try >= writeTries || errors.As(err, &status) && !apierrors.IsServerTimeout(err) && !apierrors.IsTooManyRequests(err) &&
			!apierrors.IsInternalError(err) && !apierrors.IsServiceUnavailable(err) {
			b.m.eventsSkipped.WithLabelValues("not-written").Inc()
			b.log.Warn().Err(err).Str("node", ev.InvolvedObject.Name).Str("reason", ev.Reason).Int("tries", try).Msg("an Event was not written")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (b *bridge) skip(cause string, err error) {
	b.m.eventsSkipped.WithLabelValues(cause).Inc()
	b.log.Debug().Err(err).Str("cause", cause).Msg("an agent's action not shown as an Event")
}
