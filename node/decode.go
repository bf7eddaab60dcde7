package node

import (
	"context"
	"errors"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxStampLag is how much earlier than its receipt an envelope's stamp may
// be and still be taken as it is. containerd publishes within milliseconds;
// an older stamp means its wall clock stepped back (or a replay).
const maxStampLag = 10 * time.Second

// maxStampAhead is how much later than its receipt an envelope's stamp may
// be and still be taken as it is: the agent's clock (the wall time read
// once, advanced by the uptime) and the host's may drift apart by
// milliseconds. Taken as received instead, the stamp would cap the
// container's creation time at it too, and the creation time would no
// longer tell the container from another made under its id (a stamp
// ahead makes an object look younger: it is kept, never removed early).
const maxStampAhead = time.Second

// stampAt is when something containerd stamped t happened, in the agent's
// clock, given that the agent received the news at received: t when it is
// within [received-maxStampLag, received+maxStampAhead], else received.
// containerd stamps with the host's wall clock, the agent plans with its
// own: after a forward step a stamp is far after its receipt (taken as it
// is, the thing would look younger than it is for as long as the step),
// after a backward step far before it (the thing would look older and be
// deleted early). The receipt is never before the real event, so an age
// counted from it is never longer than the real one: nothing is deleted
// early, and nothing is kept more than the delivery delay (or a second of
// drift) longer. Zero stays zero (not sent).
func stampAt(t, received time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	if t.After(received.Add(maxStampAhead)) || t.Before(received.Add(-maxStampLag)) {
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
	return t.Add(s.o.StampSkew(t)).UTC()
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
func (s *Source) decode(ctx context.Context, env *cdevents.Envelope, received time.Time) (events.Event, error) {
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
		return events.ImageDeleted{At: at, Name: e.Name}, nil
	case *apievents.ContainerCreate:
		return s.lookupContainer(ctx, at, e.ID)
	case *apievents.ContainerUpdate:
		return s.lookupContainer(ctx, at, e.ID)
	case *apievents.ContainerDelete:
		return events.ContainerDeleted{At: at, ID: e.ID}, nil
	case *apievents.TaskStart:
		return events.TaskStarted{At: at, ContainerID: e.ContainerID, Pid: e.Pid}, nil
	case *apievents.TaskExit:
		if e.ID != "" && e.ID != e.ContainerID {
			break // an exec process, not the container's init
		}
		return events.TaskExited{At: at, ContainerID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, ExitedAt: stamp(timeOf(e.ExitedAt))}, nil
	case *apievents.TaskDelete:
		if e.ID != "" && e.ID != e.ContainerID {
			break
		}
		return events.TaskExited{At: at, ContainerID: e.ContainerID, Pid: e.Pid, ExitStatus: e.ExitStatus, ExitedAt: stamp(timeOf(e.ExitedAt)), Collected: true}, nil
	}
	s.m.ignored.WithLabelValues(topicLabel(env.Topic)).Inc()
	return nil, nil
}

// timeOf converts a protobuf timestamp; nil (not sent) is the zero time,
// not 1970.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil || !inJSONRange(ts.AsTime()) {
		return time.Time{} // not sent, or not a time a task could exit at
	}
	return ts.AsTime().UTC()
}
