package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
)

// Source's wait between attempts to follow containerd: doubled after each
// failure up to the cap, back to the minimum once a session followed it.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// repairFirst is how soon a listing that left CRI containers unsure is
// followed by another: CRI records an exit right after it deletes the
// task, a few milliseconds on a quiet node.
const repairFirst = 500 * time.Millisecond

// Run follows containerd until ctx ends, sending events to out. Sending
// blocks on out, but the receive loop never does: envelopes queue (bounded)
// behind it, so a slow consumer cannot make containerd buffer without limit.
// While containerd cannot be reached, the first failure is logged at once
// and the run of them then once per backoff step with its count
// (streak.Streak); the session that follows containerd again says how many
// failed before it.
func (s *Source) Run(ctx context.Context, out chan<- events.Scoped) error {
	backoff := minBackoff
	reason := "start"
	for {
		s.resetDialBackoff()
		err := s.session(ctx, out, reason)
		lost := s.connected.Swap(false)
		if ctx.Err() != nil {
			return nil
		}
		if lost { // not the attempts that fail while containerd is away
			s.m.reconnects.Inc()
			backoff = minBackoff
		}
		// Full jitter keeps a fleet of agents from reconnecting in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		msg := "cannot follow containerd"
		if lost {
			msg = "containerd subscription ended"
		}
		if log, n := s.failures.Fail(time.Now(), err.Error()); log || lost {
			s.o.Log.Warn().Err(err).Int("failures", n).Float64("retry_in_s", wait.Seconds()).Msg(msg)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, maxBackoff)
		reason = "reconnect"
	}
}

// resetDialBackoff makes gRPC dial containerd again at the next call,
// instead of after its own backoff: the Source's backoff is the one that
// paces attempts.
func (s *Source) resetDialBackoff() {
	if s.o.Client == nil {
		return
	}
	if cc, ok := s.o.Client.Conn().(interface{ ResetConnectBackoff() }); ok {
		cc.ResetConnectBackoff()
	}
}

// Filters are the subscription filters (any one matches) for the managed
// namespaces: every namespace's events, and the namespace topics, when all
// are managed (exclusions are applied on receipt).
func Filters(n events.Namespaces) []string {
	if n.All {
		return []string{`topic~="^/(images|containers|tasks|namespaces)/"`}
	}
	out := make([]string, len(n.Names))
	for i, ns := range n.Names {
		out[i] = fmt.Sprintf(`namespace==%s,topic~="^/(images|containers|tasks)/"`, ns)
	}
	return out
}

func (s *Source) session(ctx context.Context, out chan<- events.Scoped, reason string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := s.o.Client.Version(ctx); err != nil {
		return fmt.Errorf("containerd version: %w", errgrpc.ToNative(err))
	}
	s.readContainerd(ctx) // before anything is listed
	// Subscribe first, then list: nothing that happens in between is lost.
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		return errors.New("containerd client is not a gRPC client")
	}
	stream, err := eventsapi.NewEventsClient(conn).Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: Filters(s.o.Namespaces)})
	if err != nil {
		return fmt.Errorf("subscribe: %w", errgrpc.ToNative(err))
	}
	q := newQueue(s.o.QueueSize)
	go s.receive(stream, q)

	relist := func(reason string) error {
		names, err := s.Managed(ctx)
		if err != nil {
			return err
		}
		clear(s.unsure)
		listed := make(map[string]bool, len(names))
		known := reason == "start" || reason == "reconnect"
		for _, ns := range names {
			if err := s.listInto(ctx, out, ns, known); err != nil {
				return err
			}
			listed[ns] = true
		}
		s.listed = listed
		s.m.listings.WithLabelValues(reason).Inc()
		return send(ctx, out, events.Scoped{Event: events.Round{At: s.o.Now().UTC(), Namespaces: names}})
	}
	if err := relist(reason); err != nil {
		return err
	}
	s.connected.Store(true)
	ev := s.o.Log.Info().Str("namespaces", s.o.Namespaces.String()).Strs("listed", slices.Sorted(maps.Keys(s.listed))).
		Str("reason", reason)
	if n, since := s.failures.Recover(); n > 0 {
		ev = ev.Int("failures", n).Float64("unreachable_s", time.Since(since).Seconds())
	}
	ev.Msg("following containerd")
	resync := time.NewTimer(jitter(s.o.ResyncInterval))
	defer resync.Stop()
	// A listing that left containers unsure (CRI could not tell their
	// state yet) is followed by another soon: after repairFirst, doubling
	// up to ResyncInterval while they stay unsure.
	repair := time.NewTimer(repairFirst)
	repair.Stop()
	defer repair.Stop()
	repairWait, repairArmed := repairFirst, false
	scheduleRepair := func() {
		switch {
		case len(s.unsure) == 0:
			repair.Stop()
			repairArmed, repairWait = false, repairFirst
		case !repairArmed:
			repair.Reset(repairWait)
			repairArmed, repairWait = true, min(2*repairWait, s.o.ResyncInterval)
		}
	}
	scheduleRepair()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-repair.C:
			repairArmed = false
			if err := relist("repair"); err != nil {
				return err
			}
			scheduleRepair()
		case <-resync.C:
			if err := relist("periodic"); err != nil {
				return err
			}
			scheduleRepair()
			resync.Reset(jitter(s.o.ResyncInterval))
		case <-q.ready:
			batch, overflowed, done, qerr := q.take()
			needList := overflowed
			// Envelopes are decoded (and their lookups made) together, in
			// order of emission, up to the next that needs a listing.
			var run []received
			flush := func() error {
				evs, errs := s.decodeAll(ctx, run)
				for i, r := range run {
					if errs[i] != nil {
						s.m.lookupErrors.Inc()
						s.o.Log.Warn().Err(errs[i]).Str("namespace", r.env.Namespace).Str("topic", r.env.Topic).Msg("event lookup failed; will relist")
						needList = true
						continue
					}
					if evs[i] != nil {
						if err := send(ctx, out, events.Scoped{Namespace: r.env.Namespace, Event: evs[i]}); err != nil {
							return err
						}
					}
				}
				run = run[:0]
				return nil
			}
			for _, r := range batch {
				env := r.env
				if strings.HasPrefix(env.Topic, "/namespaces/") || (s.o.Namespaces.Match(env.Namespace) && !s.listed[env.Namespace]) {
					if err := flush(); err != nil {
						return err
					}
				}
				if nerr := s.namespaceChange(ctx, out, env); nerr != errNotNamespace {
					if nerr != nil {
						return nerr
					}
					continue
				}
				if !s.o.Namespaces.Match(env.Namespace) {
					s.m.ignored.WithLabelValues(topicLabel(env.Topic)).Inc()
					continue
				}
				if !s.listed[env.Namespace] {
					// A namespace appears with its first object (containerd
					// creates it implicitly): its listing covers the event.
					if err := s.listInto(ctx, out, env.Namespace, false); err != nil {
						return err
					}
					s.listed[env.Namespace] = true
					continue
				}
				run = append(run, r)
			}
			if err := flush(); err != nil {
				return err
			}
			if done {
				return qerr
			}
			if needList {
				if err := relist("repair"); err != nil {
					return err
				}
			}
			scheduleRepair()
		}
	}
}

// decodeAll decodes run, the envelopes whose events need lookups
// (lookedUp) up to listingLookups at a time: a burst's lookups share the
// connection's writes and reads instead of taking turns (a fifth to a third
// fewer thread switches per event in BenchmarkFootprint's burst). Each
// envelope's event or error is at its index.
func (s *Source) decodeAll(ctx context.Context, run []received) ([]events.Event, []error) {
	evs, errs := make([]events.Event, len(run)), make([]error, len(run))
	var g errgroup.Group
	g.SetLimit(listingLookups)
	for i, r := range run {
		decode := func() error {
			evs[i], errs[i] = s.decode(namespaces.WithNamespace(ctx, r.env.Namespace), r.env, r.at)
			return nil
		}
		if len(run) > 1 && lookedUp[r.env.Topic] {
			g.Go(decode)
		} else {
			_ = decode()
		}
	}
	_ = g.Wait()
	return evs, errs
}

// lookedUp are the topics whose events decode asks containerd about (the
// payload decides: a topic that lies only costs a lookup its turn).
var lookedUp = map[string]bool{"/containers/create": true, "/containers/update": true, "/images/create": true, "/images/update": true}

// receive moves envelopes from the stream into the queue; it never blocks
// on the consumer. It reads the stream itself (not the client's Subscribe,
// which hands each envelope over one more goroutine) and ends with it.
func (s *Source) receive(stream eventsapi.Events_SubscribeClient, q *queue) {
	for {
		env, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("subscription closed")
			}
			q.close(errgrpc.ToNative(err))
			return
		}
		s.m.received.WithLabelValues(topicLabel(env.Topic)).Inc()
		if !q.push(&cdevents.Envelope{Timestamp: protobuf.FromTimestamp(env.Timestamp), Namespace: env.Namespace,
			Topic: env.Topic, Event: env.Event}, s.o.Now()) {
			s.m.dropped.Inc()
		}
	}
}

func send(ctx context.Context, out chan<- events.Scoped, ev events.Scoped) error {
	select {
	case out <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// Managed returns the namespaces to list, sorted: the configured ones, or
// every existing one not excluded.
func (s *Source) Managed(ctx context.Context) ([]string, error) {
	if !s.o.Namespaces.All {
		return s.o.Namespaces.Names, nil
	}
	all, err := s.o.Client.NamespaceService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	names := make([]string, 0, len(all))
	for _, ns := range all {
		if s.o.Namespaces.Match(ns) {
			names = append(names, ns)
		}
	}
	slices.Sort(names)
	return names, nil
}

// listInto lists namespace ns and sends the listing; known says whether
// it takes what the projection knows of containers (KnownContainer). It
// notes how many containers the listing left unsure (Source.unsure).
func (s *Source) listInto(ctx context.Context, out chan<- events.Scoped, ns string, known bool) error {
	l, unsure, err := s.list(ctx, ns, known)
	if err != nil {
		return err
	}
	if unsure > 0 {
		s.unsure[ns] = unsure
		s.o.Log.Debug().Str("namespace", ns).Int("containers", unsure).
			Msg("CRI cannot tell yet the state of containers without a task: their state is kept, another listing follows")
	} else {
		delete(s.unsure, ns)
	}
	return send(ctx, out, events.Scoped{Namespace: ns, Event: l})
}

// errNotNamespace says an envelope is not about a namespace's life.
var errNotNamespace = errors.New("not a namespace event")

// namespaceChange handles /namespaces/create and /namespaces/delete when
// every namespace is managed: a new namespace is listed, a deleted one
// (containerd deletes only empty ones) listed as empty. It returns
// errNotNamespace for any other envelope.
func (s *Source) namespaceChange(ctx context.Context, out chan<- events.Scoped, env *cdevents.Envelope) error {
	if !strings.HasPrefix(env.Topic, "/namespaces/") || env.Event == nil {
		return errNotNamespace
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		s.m.malformed.Inc()
		return nil
	}
	switch e := v.(type) {
	case *apievents.NamespaceCreate:
		if s.o.Namespaces.All && s.o.Namespaces.Match(e.Name) && !s.listed[e.Name] {
			s.listed[e.Name] = true
			return s.listInto(ctx, out, e.Name, false)
		}
	case *apievents.NamespaceDelete:
		if s.listed[e.Name] && s.o.Namespaces.All {
			delete(s.listed, e.Name)
			return send(ctx, out, events.Scoped{Namespace: e.Name, Event: events.Listing{At: s.o.Now().UTC()}})
		}
	}
	return nil
}
