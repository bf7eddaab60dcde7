package events

import (
	"context"
	"reflect"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
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
		want Event
	}{
		{"image delete", envelope(t, "k8s.io", "/images/delete", &apievents.ImageDelete{Name: "a:1"}), ImageDeleted{At: at, Name: "a:1"}},
		{"container delete", envelope(t, "k8s.io", "/containers/delete", &apievents.ContainerDelete{ID: "c"}), ContainerDeleted{At: at, ID: "c"}},
		{"task start", envelope(t, "k8s.io", "/tasks/start", &apievents.TaskStart{ContainerID: "c", Pid: 7}), TaskStarted{At: at, ContainerID: "c", Pid: 7}},
		{"task exit", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "c", Pid: 7, ExitStatus: 3, ExitedAt: timestamppb.New(exitedAt)}),
			TaskExited{At: at, ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: exitedAt}},
		{"task delete", envelope(t, "k8s.io", "/tasks/delete", &apievents.TaskDelete{ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: timestamppb.New(exitedAt)}),
			TaskExited{At: at, ContainerID: "c", Pid: 7, ExitStatus: 3, ExitedAt: exitedAt, Collected: true}},
		{"exit without a time", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "c", Pid: 7}),
			TaskExited{At: at, ContainerID: "c", Pid: 7}},
		{"exec exit is not the container's", envelope(t, "k8s.io", "/tasks/exit", &apievents.TaskExit{ContainerID: "c", ID: "exec-1"}), nil},
		{"other namespace", envelope(t, "moby", "/images/delete", &apievents.ImageDelete{Name: "a:1"}), nil},
		{"oom is not needed", envelope(t, "k8s.io", "/tasks/oom", &apievents.TaskOOM{ContainerID: "c"}), nil},
		{"unknown type", &cdevents.Envelope{Namespace: "k8s.io", Topic: "/tasks/new", Event: &anypb.Any{TypeUrl: "containerd.events.FromTheFuture", Value: []byte{1}}}, nil},
		{"malformed payload", &cdevents.Envelope{Namespace: "k8s.io", Topic: "/tasks/exit", Event: &anypb.Any{TypeUrl: "containerd.events.TaskExit", Value: []byte{0xff, 0xff, 0xff}}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.decode(context.Background(), tc.env)
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

// TestQueueOverflowIsRemembered: the receive loop never blocks; a full
// queue drops and says so, which makes the session relist.
func TestQueueOverflowIsRemembered(t *testing.T) {
	q := newQueue(2)
	for i := range 3 {
		ok := q.push(&cdevents.Envelope{Topic: "/tasks/start"})
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

func TestMarshalRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, ev := range []Event{
		ImageUpserted{At: at, Name: "a", Digest: "sha256:x", Labels: map[string]string{"k": "v"}, Size: 9, Created: at},
		ImageDeleted{At: at, Name: "a"},
		ContainerUpserted{At: at, ID: "c", Image: "a", CRIKind: "sandbox", PodUID: "u", Created: at},
		ContainerDeleted{At: at, ID: "c"},
		TaskStarted{At: at, ContainerID: "c", Pid: 1},
		TaskExited{At: at, ContainerID: "c", Pid: 1, ExitStatus: 2, ExitedAt: at},
		Synced{At: at},
	} {
		b, err := Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Unmarshal(b)
		if err != nil || !reflect.DeepEqual(back, ev) {
			t.Fatalf("%s: round trip %#v, %v", ev.Kind(), back, err)
		}
	}
	if _, err := Unmarshal([]byte(`{"k":"image.exploded","e":{}}`)); err == nil {
		t.Fatal("unknown kind accepted")
	}
	if _, err := Unmarshal([]byte(`{not json`)); err == nil {
		t.Fatal("garbage accepted")
	}
}
