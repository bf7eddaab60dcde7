package node

import (
	"context"
	"reflect"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func envelope(t *testing.T, ns, topic string, v any) *cdevents.Envelope {
	t.Helper()
	a, err := typeurl.MarshalAny(v)
	if err != nil {
		t.Fatal(err)
	}
	return &cdevents.Envelope{Timestamp: time.Unix(100, 0), Namespace: ns, Topic: topic, Event: a}
}

// TestDecode covers the envelopes that need no lookup, and the ones that
// must be counted and dropped.
func TestDecode(t *testing.T) {
	at := time.Unix(100, 0).UTC()
	exitedAt := time.Unix(99, 5).UTC()
	s := NewSource(Options{Registerer: prometheus.NewRegistry()})
	cases := []struct {
		name string
		env  *cdevents.Envelope
		want events.Event
	}{
		{"image delete", envelope(t, "k8s.io", "/images/delete", &apievents.ImageDelete{Name: "a:1"}), events.ImageDeleted{At: at, Name: "a:1"}},
		{"container delete", envelope(t, "k8s.io", "/containers/delete", &apievents.ContainerDelete{ID: "c"}), events.ContainerDeleted{At: at, ID: "c"}},
		{"task start", envelope(t, "k8s.io", "/tasks/start", &apievents.TaskStart{ContainerID: "c", Pid: 7}), events.TaskStarted{At: at, ContainerID: "c", Pid: 7}},
		{"task exit", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "c", Pid: 7, ExitStatus: 3, ExitedAt: timestamppb.New(exitedAt)}),
			events.TaskExited{At: at, ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: exitedAt}},
		{"task delete", envelope(t, "k8s.io", "/tasks/delete", &apievents.TaskDelete{ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: timestamppb.New(exitedAt)}),
			events.TaskExited{At: at, ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: exitedAt, Collected: true}},
		{"exit without a time", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "c", Pid: 7}),
			events.TaskExited{At: at, ContainerID: "c", Pid: 7}},
		{"exec exit is not the container's", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "exec-1"}), nil},
		{"oom is not needed", envelope(t, "k8s.io", "/tasks/oom", &apievents.TaskOOM{ContainerID: "c"}), nil},
		{"unknown type", &cdevents.Envelope{Namespace: "k8s.io", Topic: "/tasks/new", Event: &anypb.Any{TypeUrl: "containerd.events.FromTheFuture", Value: []byte{1}}}, nil},
		{"malformed payload", &cdevents.Envelope{Namespace: "k8s.io", Topic: "/tasks/exit", Event: &anypb.Any{TypeUrl: "containerd.events.TaskExit", Value: []byte{0xff, 0xff, 0xff}}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.decode(context.Background(), tc.env, at)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
	if n := testutil.ToFloat64(s.m.unknown); n != 1 {
		t.Errorf("unknown counted %v times, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.malformed); n != 1 {
		t.Errorf("malformed counted %v times, want 1", n)
	}
}

// TestStampAt: containerd's stamps are believed only within
// [receipt-maxStampLag, receipt]; outside, the receipt time is used, so a
// wall-clock step of containerd's host in either direction never makes
// anything look older than it is.
func TestStampAt(t *testing.T) {
	rcv := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		stamp, want time.Time
	}{
		{"on time", rcv.Add(-time.Millisecond), rcv.Add(-time.Millisecond)},
		{"at receipt", rcv, rcv},
		{"lag at the bound", rcv.Add(-maxStampLag), rcv.Add(-maxStampLag)},
		{"forward step +1h", rcv.Add(time.Hour), rcv},
		{"slightly ahead (clocks drifting apart)", rcv.Add(time.Millisecond), rcv.Add(time.Millisecond)},
		{"ahead at the bound", rcv.Add(maxStampAhead), rcv.Add(maxStampAhead)},
		{"just past the bound ahead", rcv.Add(maxStampAhead + time.Nanosecond), rcv},
		{"backward step -1h", rcv.Add(-time.Hour), rcv},
		{"just past the lag", rcv.Add(-maxStampLag - time.Nanosecond), rcv},
		{"not sent", time.Time{}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stampAt(tc.stamp, rcv); !got.Equal(tc.want) {
				t.Fatalf("stampAt(%v) = %v, want %v", tc.stamp, got, tc.want)
			}
		})
	}
}

// TestDecodeStepped: envelopes stamped by a containerd whose clock stepped
// an hour either way come out at their receipt, exit times included; a skew
// (the e2e's emulated host step) applies to every stamp before the bound.
func TestDecodeStepped(t *testing.T) {
	stamped := time.Unix(100, 0).UTC() // envelope's Timestamp
	for _, tc := range []struct {
		name     string
		received time.Time
		skew     time.Duration
		want     time.Time
	}{
		{"containerd 1h ahead", stamped.Add(-time.Hour), 0, stamped.Add(-time.Hour)},
		{"containerd 1h behind", stamped.Add(time.Hour), 0, stamped.Add(time.Hour)},
		{"host stepped +1h (skew)", stamped.Add(time.Second), time.Hour, stamped.Add(time.Second)},
		{"host stepped -1h (skew)", stamped.Add(time.Second), -time.Hour, stamped.Add(time.Second)},
		{"skew within the lag", stamped.Add(time.Second), -time.Second, stamped.Add(-time.Second)},
		{"the agent's clock a few ms behind the host's", stamped.Add(-5 * time.Millisecond), 0, stamped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSource(Options{Registerer: prometheus.NewRegistry(), StampSkew: func(time.Time) time.Duration { return tc.skew }})
			env := envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "c", Pid: 7, ExitedAt: timestamppb.New(stamped)})
			got, err := s.decode(context.Background(), env, tc.received)
			if err != nil {
				t.Fatal(err)
			}
			want := events.TaskExited{At: tc.want, ContainerID: "c", Pid: 7, ExitedAt: tc.want}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %#v\nwant %#v", got, want)
			}
		})
	}
}

// TestQueueOverflowIsRemembered: the receive loop never blocks; a full
// queue drops and says so, which makes the session relist.
func TestQueueOverflowIsRemembered(t *testing.T) {
	q := newQueue(2)
	for i := range 3 {
		ok := q.push(&cdevents.Envelope{Topic: "/tasks/start"}, time.Time{})
		if want := i < 2; ok != want {
			t.Fatalf("push %d: %v", i, ok)
		}
	}
	items, overflowed, done, _ := q.take()
	if len(items) != 2 || !overflowed || done {
		t.Fatalf("take: %d items, overflowed %v, done %v", len(items), overflowed, done)
	}
	if _, overflowed, _, _ := q.take(); overflowed {
		t.Fatal("overflow flag not reset")
	}
}
