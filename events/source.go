package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Options configures a Source.
type Options struct {
	// Client talks to containerd; it reconnects by itself after a restart.
	Client *client.Client
	// CRI, if set, tells exited CRI containers from never-started ones when
	// a listing finds them without a task (CRI deletes the task on exit).
	CRI runtime.RuntimeServiceClient
	// Namespaces to follow. Default k8s.io only.
	Namespaces Namespaces
	// ResyncInterval is the period of full listings, jittered by ±10%.
	// Default 5m. Events are hints; the listing is the truth.
	ResyncInterval time.Duration
	// QueueSize bounds the envelopes waiting for enrichment. When it
	// overflows, envelopes are dropped and a full listing repairs the state.
	// Default 65536.
	QueueSize int
	// KnownFacts returns what the projection already holds for a target
	// digest (zero if none), so a listing does not read the content again.
	KnownFacts func(digest string) ImageFacts
	// KnownContainer returns the facts the projection holds of CRI
	// container id of namespace ns, if it holds that very container (the
	// same creation time), so the listings that follow a start or a
	// reconnect, which readiness waits for, decode the spec and CRI
	// metadata of only the containers they do not know. Periodic and repair
	// listings decode every one: a fact a failed lookup missed is mended
	// within ResyncInterval.
	KnownContainer func(ns, id string, created time.Time) (ContainerFacts, bool)
	// Now is the agent's clock (internal/clock: no wall-clock step moves
	// it); default time.Now. Event times are bounded by it at receipt
	// (see stampAt).
	Now func() time.Time
	// StampSkew, for end-to-end tests only, is added to every time
	// containerd stamps (event times, exits, creations): it emulates a step
	// of the host's wall clock as containerd would see it. Nil: none.
	StampSkew  func() time.Duration
	Log        zerolog.Logger
	Registerer prometheus.Registerer
}

// Source follows containerd and emits domain events, each scoped to its
// namespace: a Listing of every managed namespace and a Round after every
// (re)subscribe and periodically, a Listing of a namespace when it first
// appears, and one event per relevant envelope in between. It never exits
// because containerd went away.
type Source struct {
	o         Options
	connected atomic.Bool
	// listed are the namespaces the current session has listed; the
	// session's goroutine only.
	listed map[string]bool
	m      sourceMetrics
}

type sourceMetrics struct {
	received, ignored     *prometheus.CounterVec
	unknown, malformed    prometheus.Counter
	dropped, lookupErrors prometheus.Counter
	reconnects            prometheus.Counter
	listings              *prometheus.CounterVec
	listSeconds           prometheus.Histogram
}

// NewSource returns a Source; Run starts it.
func NewSource(o Options) *Source {
	if !o.Namespaces.All && len(o.Namespaces.Names) == 0 {
		o.Namespaces.Names = []string{CRINamespace}
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 5 * time.Minute
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 65536
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StampSkew == nil {
		o.StampSkew = func() time.Duration { return 0 }
	}
	if o.KnownFacts == nil {
		o.KnownFacts = func(string) ImageFacts { return ImageFacts{} }
	}
	if o.KnownContainer == nil {
		o.KnownContainer = func(string, string, time.Time) (ContainerFacts, bool) { return ContainerFacts{}, false }
	}
	s := &Source{o: o}
	s.m = sourceMetrics{
		received:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_received_total", Help: "containerd envelopes received, by topic."}, []string{"topic"}),
		ignored:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_ignored_total", Help: "Envelopes received but not needed, by topic."}, []string{"topic"}),
		unknown:      prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_unknown_total", Help: "Envelopes of unknown type, dropped."}),
		malformed:    prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_malformed_total", Help: "Envelopes that could not be decoded, dropped."}),
		dropped:      prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_dropped_total", Help: "Envelopes dropped because the queue was full (a listing follows)."}),
		lookupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_lookup_errors_total", Help: "Failed lookups while enriching an envelope (a listing follows)."}),
		reconnects:   prometheus.NewCounter(prometheus.CounterOpts{Name: "gcagent_events_reconnects_total", Help: "Subscriptions to containerd that were lost after the agent followed it (each is reopened); attempts that fail meanwhile are not counted."}),
		listings:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gcagent_events_listings_total", Help: "Full listings of containerd, by reason."}, []string{"reason"}),
		listSeconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gcagent_events_listing_seconds", Help: "Time to list images, containers and tasks.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.m.received, s.m.ignored, s.m.unknown, s.m.malformed, s.m.dropped,
			s.m.lookupErrors, s.m.reconnects, s.m.listings, s.m.listSeconds)
	}
	return s
}

// Connected reports whether a subscription to containerd is open.
func (s *Source) Connected() bool { return s.connected.Load() }

// Run follows containerd until ctx ends, sending events to out. Sending
// blocks on out, but the receive loop never does: envelopes queue (bounded)
// behind it, so a slow consumer cannot make containerd buffer without limit.
func (s *Source) Run(ctx context.Context, out chan<- Scoped) error {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	reason := "start"
	for {
		began := time.Now()
		err := s.session(ctx, out, reason)
		lost := s.connected.Swap(false)
		if ctx.Err() != nil {
			return nil
		}
		if lost { // not the attempts that fail while containerd is away
			s.m.reconnects.Inc()
		}
		if time.Since(began) > 30*time.Second {
			backoff = minBackoff
		}
		// Full jitter keeps a fleet of agents from reconnecting in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		s.o.Log.Warn().Err(err).Dur("retry_in", wait).Msg("containerd subscription ended")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, maxBackoff)
		reason = "reconnect"
	}
}

// Filters are the subscription filters (any one matches) for the managed
// namespaces: every namespace's events, and the namespace topics, when all
// are managed (exclusions are applied on receipt).
func Filters(n Namespaces) []string {
	if n.All {
		return []string{`topic~="^/(images|containers|tasks|namespaces)/"`}
	}
	out := make([]string, len(n.Names))
	for i, ns := range n.Names {
		out[i] = fmt.Sprintf(`namespace==%s,topic~="^/(images|containers|tasks)/"`, ns)
	}
	return out
}

func (s *Source) session(ctx context.Context, out chan<- Scoped, reason string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := s.o.Client.Version(ctx); err != nil {
		return fmt.Errorf("containerd version: %w", err)
	}
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
		return send(ctx, out, Scoped{Event: Round{At: s.o.Now().UTC(), Namespaces: names}})
	}
	if err := relist(reason); err != nil {
		return err
	}
	s.connected.Store(true)
	s.o.Log.Info().Str("namespaces", s.o.Namespaces.String()).Strs("listed", slices.Sorted(maps.Keys(s.listed))).
		Str("reason", reason).Msg("following containerd")
	resync := time.NewTimer(jitter(s.o.ResyncInterval))
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-resync.C:
			if err := relist("periodic"); err != nil {
				return err
			}
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
						if err := send(ctx, out, Scoped{Namespace: r.env.Namespace, Event: evs[i]}); err != nil {
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
		}
	}
}

// decodeAll decodes run, the envelopes whose events need lookups
// (lookedUp) up to listingLookups at a time: a burst's lookups share the
// connection's writes and reads instead of taking turns (a fifth to a third
// fewer thread switches per event in BenchmarkFootprint's burst). Each
// envelope's event or error is at its index.
func (s *Source) decodeAll(ctx context.Context, run []received) ([]Event, []error) {
	evs, errs := make([]Event, len(run)), make([]error, len(run))
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

func send(ctx context.Context, out chan<- Scoped, ev Scoped) error {
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

// maxStampLag is how much earlier than its receipt an envelope's stamp may
// be and still be taken as it is. containerd publishes within milliseconds;
// an older stamp means its wall clock stepped back (or a replay).
const maxStampLag = 10 * time.Second

// stampAt is when something containerd stamped t happened, in the agent's
// clock, given that the agent received the news at received: t when it is
// within [received-maxStampLag, received], else received. containerd
// stamps with the host's wall clock, the agent plans with its own: after a
// forward step a stamp is after its receipt (taken as it is, the thing
// would look younger than it is for as long as the step), after a backward
// step far before it (the thing would look older and be deleted early).
// The receipt is never before the real event, so an age counted from it is
// never longer than the real one: nothing is deleted early, and nothing is
// kept more than the delivery delay longer. Zero stays zero (not sent).
func stampAt(t, received time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	if t.After(received) || t.Before(received.Add(-maxStampLag)) {
		return received
	}
	return t
}

// skewed is a time containerd stamped, in UTC, plus the test-only
// StampSkew; zero (not sent) stays zero.
func (s *Source) skewed(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(s.o.StampSkew()).UTC()
}

// notAfter bounds a time a listing read from containerd (an exit, a
// creation) by the listing's own time: a listing shows what happened before
// it, possibly long before (the agent was down), but never after.
func notAfter(t, at time.Time) time.Time {
	if t.After(at) {
		return at
	}
	return t
}

// decode turns an envelope into a domain event, or nil for one gcagent does
// not need; received is the agent's time of its receipt, which bounds the
// envelope's stamps (stampAt). An error means a lookup failed and the state
// may now be behind.
func (s *Source) decode(ctx context.Context, env *cdevents.Envelope, received time.Time) (Event, error) {
	if env.Event == nil {
		return nil, nil
	}
	v, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		if errors.Is(err, typeurl.ErrNotFound) {
			s.m.unknown.Inc()
		} else {
			s.m.malformed.Inc()
			s.o.Log.Warn().Err(err).Str("topic", env.Topic).Msg("malformed event dropped")
		}
		return nil, nil
	}
	// Bounded to [received-10s, received], so always a time the journal
	// can hold, whatever the envelope says.
	stamp := func(t time.Time) time.Time { return stampAt(s.skewed(t), received) }
	at := stamp(env.Timestamp)
	switch e := v.(type) {
	case *apievents.ImageCreate:
		return s.lookupImage(ctx, at, e.Name)
	case *apievents.ImageUpdate:
		return s.lookupImage(ctx, at, e.Name)
	case *apievents.ImageDelete:
		return ImageDeleted{At: at, Name: e.Name}, nil
	case *apievents.ContainerCreate:
		return s.lookupContainer(ctx, at, e.ID)
	case *apievents.ContainerUpdate:
		return s.lookupContainer(ctx, at, e.ID)
	case *apievents.ContainerDelete:
		return ContainerDeleted{At: at, ID: e.ID}, nil
	case *apievents.TaskStart:
		return TaskStarted{At: at, ContainerID: e.ContainerID, Pid: e.Pid}, nil
	case *apievents.TaskExit:
		if e.ID != "" && e.ID != e.ContainerID {
			break // an exec process, not the container's init
		}
		return TaskExited{At: at, ContainerID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, ExitedAt: stamp(timeOf(e.ExitedAt))}, nil
	case *apievents.TaskDelete:
		if e.ID != "" && e.ID != e.ContainerID {
			break
		}
		return TaskExited{At: at, ContainerID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, ExitedAt: stamp(timeOf(e.ExitedAt)), Collected: true}, nil
	}
	s.m.ignored.WithLabelValues(topicLabel(env.Topic)).Inc()
	return nil, nil
}

func (s *Source) lookupImage(ctx context.Context, at time.Time, name string) (Event, error) {
	img, err := s.o.Client.ImageService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, nil // deleted since; its delete event follows
	}
	if err != nil {
		return nil, fmt.Errorf("get image %q: %w", name, err)
	}
	return imageEvent(at, img, s.facts(ctx, img)), nil
}

func (s *Source) lookupContainer(ctx context.Context, at time.Time, id string) (Event, error) {
	c, err := s.o.Client.ContainerService().Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get container %q: %w", id, err)
	}
	ns, _ := namespaces.Namespace(ctx)
	ev := containerEventIn(ns, at, c, nil)
	ev.Created = s.created(c, at)
	if c.Image != "" {
		if img, err := s.o.Client.ImageService().Get(ctx, c.Image); err == nil {
			ev.ImageDigest = img.Target.Digest.String()
		}
	}
	parentOf := func(c containers.Container) string {
		info, err := s.o.Client.SnapshotService(snapshotterOf(c)).Stat(ctx, c.SnapshotKey)
		if err != nil {
			return ""
		}
		return info.Parent
	}
	// A sandbox's image volumes appear after the sandbox; the listings and
	// the app containers' own volume mounts cover them.
	noVolumes := func(string) []string { return nil }
	id, vols := criImageRefs(c)
	criFacts(&ev, id, vols, s.configOf(ctx, nil, nil))
	contentFacts(&ev, c, parentOf, noVolumes)
	return ev, nil
}

// configOf returns a resolver of image refs (names, normalized or not, or
// CRI image ids) to config digests; listed maps names to images when a
// listing has them, else the image service is asked; facts are the
// listing's, by target digest (nil: none).
func (s *Source) configOf(ctx context.Context, listed map[string]images.Image, facts map[string]ImageFacts) func(string) string {
	return func(ref string) string {
		for _, name := range normalizedRefs(ref) {
			img, ok := listed[name]
			if !ok && listed == nil {
				var err error
				img, err = s.o.Client.ImageService().Get(ctx, name)
				ok = err == nil
			}
			if ok {
				f, known := facts[img.Target.Digest.String()]
				if !known {
					f = s.facts(ctx, img)
				}
				if f.Config != "" {
					return f.Config
				}
			}
		}
		if configDigestRe.MatchString(ref) {
			return ref // a CRI image id with no name of that spelling
		}
		return ""
	}
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
// it takes what the projection knows of containers (KnownContainer).
func (s *Source) listInto(ctx context.Context, out chan<- Scoped, ns string, known bool) error {
	l, err := s.list(ctx, ns, known)
	if err != nil {
		return err
	}
	return send(ctx, out, Scoped{Namespace: ns, Event: l})
}

// errNotNamespace says an envelope is not about a namespace's life.
var errNotNamespace = errors.New("not a namespace event")

// namespaceChange handles /namespaces/create and /namespaces/delete when
// every namespace is managed: a new namespace is listed, a deleted one
// (containerd deletes only empty ones) listed as empty. It returns
// errNotNamespace for any other envelope.
func (s *Source) namespaceChange(ctx context.Context, out chan<- Scoped, env *cdevents.Envelope) error {
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
			return send(ctx, out, Scoped{Namespace: e.Name, Event: Listing{At: s.o.Now().UTC()}})
		}
	}
	return nil
}

// List takes a full picture of namespace ns, as a listing after a start
// does (it takes what KnownContainer knows).
func (s *Source) List(ctx context.Context, ns string) (Listing, error) {
	return s.list(ctx, ns, true)
}

func (s *Source) list(ctx context.Context, ns string, useKnown bool) (Listing, error) {
	ctx = namespaces.WithNamespace(ctx, ns)
	began := time.Now()
	defer func() { s.m.listSeconds.Observe(time.Since(began).Seconds()) }()
	at := s.o.Now().UTC()

	// The images, the containers with their snapshots, and the tasks are
	// listed at once: containerd serves one while the agent decodes
	// another. The events that follow the listing repair what changed
	// meanwhile, whatever the order.
	var (
		imgs         []images.Image
		ctrs         []listedContainer
		snapshotters []string
		ix           snapshotIndex
		tasks        *tasksapi.ListTasksResponse
	)
	lists, lctx := errgroup.WithContext(ctx)
	lists.Go(func() (err error) {
		if imgs, err = s.o.Client.ImageService().List(lctx); err != nil {
			return fmt.Errorf("list images: %w", err)
		}
		return nil
	})
	lists.Go(func() (err error) {
		var known *ContainerFacts // of the record being streamed
		if err = s.streamContainers(lctx, func(c *containers.Container) bool {
			known = s.knownContainer(ns, at, c, useKnown)
			return known == nil
		}, func(c containers.Container) {
			ctrs = append(ctrs, s.slim(ns, at, c, known))
		}); err != nil {
			return fmt.Errorf("list containers: %w", err)
		}
		snapshotters = []string{defaultSnapshotter}
		for _, lc := range ctrs {
			snapshotters = append(snapshotters, snapshotterOf(lc.c))
		}
		slices.Sort(snapshotters)
		snapshotters = slices.Compact(snapshotters)
		ix, err = s.walkSnapshots(lctx, snapshotters)
		return err
	})
	lists.Go(func() (err error) {
		if tasks, err = s.o.Client.TaskService().List(lctx, &tasksapi.ListTasksRequest{}); err != nil {
			return fmt.Errorf("list tasks: %w", err)
		}
		return nil
	})
	// What CRI reports exited, for criExits: CRI deletes an exited
	// container's task, so the tasks do not tell.
	var (
		exited  map[string]bool
		askEach bool
	)
	if ns == CRINamespace && s.o.CRI != nil {
		lists.Go(func() error {
			exited, askEach = s.criExited(lctx)
			return nil
		})
	}
	if err := lists.Wait(); err != nil {
		return Listing{}, err
	}

	l := Listing{At: at, Images: make([]ImageUpserted, len(imgs))}
	digests := make(map[string]string, len(imgs))
	byName := make(map[string]images.Image, len(imgs))
	// Facts the projection holds (a restart) cost nothing; the others come
	// from one listing of the content store's labels, or are read once per
	// target digest (names share them), listingLookups at a time.
	facts := make(map[string]ImageFacts, len(imgs)) // by target digest
	var unknown []images.Image
	for _, img := range imgs {
		d := img.Target.Digest.String()
		digests[img.Name], byName[img.Name] = d, img
		if _, seen := facts[d]; seen {
			continue
		}
		f, ok := s.knownFacts(d)
		facts[d] = f
		if !ok {
			unknown = append(unknown, img)
		}
	}
	if len(unknown) > 0 {
		cix := s.listContent(ctx, snapshotters)
		read := make([]ImageFacts, len(unknown))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(listingLookups)
		for i, img := range unknown {
			known := facts[img.Target.Digest.String()]
			g.Go(func() error {
				read[i] = s.readFacts(gctx, img, known, cix)
				return nil
			})
		}
		_ = g.Wait()
		for i, img := range unknown {
			facts[img.Target.Digest.String()] = read[i]
		}
	}
	for i, img := range imgs {
		l.Images[i] = imageEvent(at, img, facts[digests[img.Name]])
	}

	parentOf := func(c containers.Container) string { return ix.parents[snapshotterOf(c)+"/"+c.SnapshotKey] }
	volumesOf := func(sb string) []string { return ix.volumes[sb] }
	configOf := s.configOf(ctx, byName, facts)
	l.Containers = make([]ContainerUpserted, 0, len(ctrs))
	for _, lc := range ctrs {
		ev := lc.ev
		ev.ImageDigest = digests[lc.c.Image]
		if lc.known != nil {
			lc.known.fill(&ev)
		} else {
			criFacts(&ev, lc.imageID, lc.volumes, configOf)
		}
		contentFacts(&ev, lc.c, parentOf, volumesOf)
		l.Containers = append(l.Containers, ev)
	}

	for _, p := range tasks.Tasks {
		id := p.ContainerID
		if id == "" {
			id = p.ID
		}
		t := Task{ContainerID: id, Pid: p.Pid, Status: taskStatus(p.Status), ExitStatus: p.ExitStatus}
		if p.ExitedAt != nil && t.Status == TaskStopped {
			t.ExitedAt = notAfter(s.skewed(p.ExitedAt.AsTime()), at)
		}
		l.Tasks = append(l.Tasks, t)
	}
	if exited != nil {
		s.criExits(ctx, &l, exited, askEach)
	}
	return l, nil
}

// listedContainer is what a listing holds of a container record until the
// images are listed: a busy node's records are 10 KiB and more each (a CRI
// container's spec, its CRI metadata), and only a little of them is read.
type listedContainer struct {
	c     containers.Container // without its spec and extensions
	ev    ContainerUpserted    // all but the image digest and content facts
	known *ContainerFacts      // what the projection knows of it (KnownContainer), or nil
	// The refs CRI stored (criImageRefs), when not known.
	imageID string
	volumes []string
}

// slim converts c as far as a listing can before the images are listed,
// reading its spec and CRI metadata only when known (knownContainer) is
// nil, and drops them.
func (s *Source) slim(ns string, at time.Time, c containers.Container, known *ContainerFacts) listedContainer {
	lc := listedContainer{known: known}
	lc.ev = containerEventIn(ns, at, c, known)
	lc.ev.Created = s.created(c, at)
	if known == nil {
		lc.imageID, lc.volumes = criImageRefs(c)
	}
	c.Spec, c.Extensions = nil, nil
	lc.c = c
	return lc
}

// knownContainer is what the projection knows of CRI container c, when
// useKnown and the projection holds it with the same creation time; nil
// otherwise, and then the listing reads c's spec and CRI metadata.
func (s *Source) knownContainer(ns string, at time.Time, c *containers.Container, useKnown bool) *ContainerFacts {
	if !useKnown || ns != CRINamespace || c.Labels[labelCRIKind] != "container" {
		return nil
	}
	if f, ok := s.o.KnownContainer(ns, c.ID, s.created(*c, at)); ok {
		return &f
	}
	return nil
}

// created is c's creation time as the agent records it: containerd's
// stamp (skewed in tests), bounded by at, the time the agent learnt of it.
func (s *Source) created(c containers.Container, at time.Time) time.Time {
	return notAfter(s.skewed(c.CreatedAt.UTC()), at)
}

// streamContainers calls each with every container record of the
// namespace in ctx, as containerd streams them one message each (a daemon
// without ListStream sends one message of them all). Each record comes
// with its spec and CRI metadata only if bodies, called just before each
// with the rest of it, wants them.
func (s *Source) streamContainers(ctx context.Context, bodies func(*containers.Container) bool, each func(containers.Container)) error {
	all := func() error {
		ctrs, err := s.o.Client.ContainerService().List(ctx)
		for _, c := range ctrs {
			bodies(&c) // read anyway
			each(c)
		}
		return err
	}
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		return all()
	}
	stream, err := containersapi.NewContainersClient(conn).ListStream(ctx, &containersapi.ListContainersRequest{}, grpc.ForceCodecV2(newListCodec()))
	if err != nil {
		return errgrpc.ToNative(err)
	}
	for n := 0; ; n++ {
		m := streamedContainer{bodies: bodies}
		err := stream.RecvMsg(&m)
		switch {
		case err == io.EOF:
			return nil
		case n == 0 && status.Code(err) == codes.Unimplemented:
			return all()
		case err != nil:
			return errgrpc.ToNative(err)
		}
		each(m.c)
	}
}

// listingLookups bounds the per-item calls a listing has in flight: image
// facts it must read, exit statuses it asks CRI.
const listingLookups = 8

// criExited lists what CRI reports exited: containers and sandboxes. CRI
// errors give none: such containers then count as never started, which
// keeps them. Only a missing CRI plugin goes unsaid. A list of exited
// containers over the runtime's send limit (CRIContainers) sets askEach
// instead: criExits then asks each CRI container without a task.
func (s *Source) criExited(ctx context.Context) (exited map[string]bool, askEach bool) {
	exited = map[string]bool{}
	failed := func(what string, err error) bool {
		if err != nil && status.Code(err) != codes.Unimplemented {
			s.o.Log.Warn().Err(err).Str("list", what).Msg("CRI list failed: exited containers without a task are kept until it works")
		}
		return err != nil
	}
	ctrs, err := CRIContainers(ctx, s.o.CRI, &runtime.ContainerFilter{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_EXITED}})
	switch {
	case status.Code(err) == codes.ResourceExhausted:
		s.o.Log.Info().Err(err).Msg("CRI's list of exited containers is over its send limit: each container without a task is asked instead")
		askEach = true
	case !failed("exited containers", err):
		for _, c := range ctrs {
			exited[c.Id] = true
		}
	}
	sbs, err := s.o.CRI.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{
		Filter: &runtime.PodSandboxFilter{State: &runtime.PodSandboxStateValue{State: runtime.PodSandboxState_SANDBOX_NOTREADY}},
	})
	if !failed("not-ready sandboxes", err) {
		for _, p := range sbs.Items {
			exited[p.Id] = true
		}
	}
	return exited, askEach
}

// criExits adds a stopped Task for each CRI container or sandbox of the
// listing that exited (criExited) and has no task left, with the exit code
// and time CRI keeps for a container (asked listingLookups at a time).
// With askEach, every CRI container without a task is asked, and stopped
// when CRI says it exited.
func (s *Source) criExits(ctx context.Context, l *Listing, exited map[string]bool, askEach bool) {
	hasTask := make(map[string]bool, len(l.Tasks))
	for _, t := range l.Tasks {
		hasTask[t.ContainerID] = true
	}
	type exit struct {
		Task
		confirmed bool // exited per the list, or per its status when asked
	}
	var (
		stopped []exit
		ask     []int // the containers' (not sandboxes') among them
	)
	for _, c := range l.Containers {
		if c.CRIKind == "" || hasTask[c.ID] || !(exited[c.ID] || askEach && c.CRIKind == "container") {
			continue
		}
		if c.CRIKind == "container" {
			ask = append(ask, len(stopped))
		}
		stopped = append(stopped, exit{Task{ContainerID: c.ID, Status: TaskStopped, ExitedAt: l.At}, exited[c.ID]})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listingLookups)
	for _, i := range ask {
		t := &stopped[i]
		g.Go(func() error {
			st, err := s.o.CRI.ContainerStatus(gctx, &runtime.ContainerStatusRequest{ContainerId: t.ContainerID})
			if err == nil && st.Status != nil {
				t.confirmed = t.confirmed || st.Status.State == runtime.ContainerState_CONTAINER_EXITED
				t.ExitStatus = uint32(st.Status.ExitCode)
				if st.Status.FinishedAt > 0 {
					t.ExitedAt = notAfter(s.skewed(time.Unix(0, st.Status.FinishedAt)), l.At)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	for _, t := range stopped {
		if t.confirmed {
			l.Tasks = append(l.Tasks, t.Task)
		}
	}
}

// CallTimeout bounds every unary call to containerd and CRI that its
// caller did not bound: a hung daemon fails calls instead of stalling GC.
const CallTimeout = 30 * time.Second

// maxCRIMessage lets CRI listings of tens of thousands of containers in
// (a gRPC client takes 4 MiB by default, the kubelet's 16 MiB; 30,000
// containers are 22-24 MiB). containerd sends at most 16 MiB unless its
// [grpc] max_send_message_size is raised.
const maxCRIMessage = 256 << 20

// DeadlineInterceptor gives every unary call without a deadline one of d.
// Streams (the event subscription) are left alone.
func DeadlineInterceptor(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// ClientOpts are the containerd client options gcagent uses: every unary
// call bounded by CallTimeout.
func ClientOpts() []client.Opt {
	return []client.Opt{client.WithExtraDialOpts([]grpc.DialOption{
		grpc.WithChainUnaryInterceptor(DeadlineInterceptor(CallTimeout)),
	})}
}

// DialCRI opens a gRPC connection for CRI clients on containerd's socket,
// with every unary call bounded by CallTimeout and room for large
// listings. It does not dial until the first call.
func DialCRI(address string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(DeadlineInterceptor(CallTimeout)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCRIMessage)))
	if err != nil {
		return nil, fmt.Errorf("cri %s: %w", address, err)
	}
	return conn, nil
}

// timeOf converts a protobuf timestamp; nil (not sent) is the zero time,
// not 1970.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil || !inJSONRange(ts.AsTime()) {
		return time.Time{} // not sent, or not a time a task could exit at
	}
	return ts.AsTime().UTC()
}

func taskStatus(st tasktypes.Status) TaskStatus {
	switch st {
	case tasktypes.Status_CREATED:
		return TaskCreated
	case tasktypes.Status_RUNNING:
		return TaskRunning
	case tasktypes.Status_STOPPED:
		return TaskStopped
	case tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		return TaskPaused
	}
	return TaskUnknown
}

// queue is the bounded hand-off between the receive loop and enrichment.
type queue struct {
	mu         sync.Mutex
	items      []received
	max        int
	overflowed bool
	done       bool
	err        error
	ready      chan struct{}
}

func newQueue(max int) *queue { return &queue{max: max, ready: make(chan struct{}, 1)} }

// received is an envelope and the agent's time of its receipt.
type received struct {
	env *cdevents.Envelope
	at  time.Time
}

// push adds an envelope received at at; it returns false (and remembers the
// overflow) when the queue is full.
func (q *queue) push(env *cdevents.Envelope, at time.Time) bool {
	q.mu.Lock()
	ok := len(q.items) < q.max
	if ok {
		q.items = append(q.items, received{env, at})
	} else {
		q.overflowed = true
	}
	q.mu.Unlock()
	q.signal()
	return ok
}

func (q *queue) close(err error) {
	q.mu.Lock()
	q.done, q.err = true, err
	q.mu.Unlock()
	q.signal()
}

func (q *queue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns everything queued and resets the overflow flag.
func (q *queue) take() (items []received, overflowed, done bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	items, q.items = q.items, nil
	overflowed, q.overflowed = q.overflowed, false
	return items, overflowed, q.done, q.err
}
