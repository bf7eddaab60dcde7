package node

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/client"
	cdevents "github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fuzzTypeURLs are the event types a containerd daemon really sends, so the
// fuzzer spends its time in their decoders rather than on unknown types.
var fuzzTypeURLs = []string{
	"containerd.events.ImageCreate", "containerd.events.ImageUpdate", "containerd.events.ImageDelete",
	"containerd.events.ContainerCreate", "containerd.events.ContainerUpdate", "containerd.events.ContainerDelete",
	"containerd.events.TaskStart", "containerd.events.TaskExit", "containerd.events.TaskDelete",
	"containerd.events.TaskOOM", "containerd.events.SnapshotPrepare", "containerd.events.ContentDelete",
}

// FuzzDecodeEnvelope feeds arbitrary envelopes (topic, namespace, type and
// payload bytes) through the Source's decode path. Decoding must never panic;
// only envelopes that need a lookup may return an error (the lookup cannot
// reach containerd here), and every event it returns must survive the
// journal's encoding unchanged.
func FuzzDecodeEnvelope(f *testing.F) {
	seed := func(topic string, v any) {
		a, err := typeurl.MarshalAny(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(topic, true, uint8(0), a.GetTypeUrl(), a.GetValue(), int64(100))
	}
	seed("/images/create", &apievents.ImageCreate{Name: "example.test/a:1", Labels: map[string]string{"k": "v"}})
	seed("/images/delete", &apievents.ImageDelete{Name: "example.test/a:1"})
	seed("/containers/create", &apievents.ContainerCreate{ID: "c1", Image: "example.test/a:1"})
	seed("/containers/delete", &apievents.ContainerDelete{ID: "c1"})
	seed("/tasks/start", &apievents.TaskStart{ContainerID: "c1", Pid: 42})
	seed("/tasks/exit", &apievents.TaskExit{ContainerID: "c1", ID: "c1", Pid: 42, ExitStatus: 137, ExitedAt: timestamppb.New(time.Unix(99, 1))})
	seed("/tasks/exit", &apievents.TaskExit{ContainerID: "c1", ID: "exec-1"})
	seed("/tasks/delete", &apievents.TaskDelete{ContainerID: "c1", Pid: 42, ExitedAt: &timestamppb.Timestamp{Seconds: -1 << 62, Nanos: -5}})
	seed("/tasks/oom", &apievents.TaskOOM{ContainerID: "c1"})
	f.Add("/tasks/exit", true, uint8(7), "", []byte{0xff, 0xff, 0xff}, int64(0))
	f.Add("", false, uint8(200), "containerd.events.FromTheFuture", []byte{1}, int64(-1))

	// client.New does not dial; with a cancelled context every lookup
	// fails at once instead of waiting for a daemon.
	cl, err := client.New(filepath.Join(f.TempDir(), "no.sock"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cl.Close() })
	s := NewSource(Options{Client: cl, Registerer: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	f.Fuzz(func(t *testing.T, topic string, ours bool, pick uint8, typeURL string, value []byte, unix int64) {
		if pick < uint8(len(fuzzTypeURLs)) {
			typeURL = fuzzTypeURLs[pick]
		}
		ns := "moby"
		if ours {
			ns = "k8s.io"
		}
		env := &cdevents.Envelope{Timestamp: time.Unix(unix, 0), Namespace: ns, Topic: topic,
			Event: &anypb.Any{TypeUrl: typeURL, Value: value}}
		ev, err := s.decode(ctx, env, time.Now())
		if err != nil {
			v, _ := typeurl.UnmarshalAny(env.Event) // several type URLs name one type
			switch v.(type) {
			case *apievents.ImageCreate, *apievents.ImageUpdate, *apievents.ContainerCreate, *apievents.ContainerUpdate:
				return // a lookup, and there is no daemon
			}
			t.Fatalf("decode %s (%T): error without a lookup: %v", typeURL, v, err)
		}
		if ev == nil {
			return
		}
		if !ours {
			t.Fatalf("event %#v from another namespace", ev)
		}
		b, err := events.Marshal(ev)
		if err != nil {
			t.Fatalf("journal encode %#v: %v", ev, err)
		}
		back, err := events.Unmarshal(b)
		if err != nil {
			t.Fatalf("journal decode %s: %v", b, err)
		}
		if !eventsEqual(ev, back) {
			t.Fatalf("journal round trip changed the event:\n got %#v\nwant %#v", back, ev)
		}
	})
}

// eventsEqual compares events as the journal sees them: times by instant
// (JSON drops the monotonic reading and the location name), and an empty
// map equal to a nil one.
func eventsEqual(a, b events.Event) bool {
	ja, errA := events.Marshal(a)
	jb, errB := events.Marshal(b)
	return errA == nil && errB == nil && reflect.DeepEqual(ja, jb) && a.Kind() == b.Kind() && a.Time().Equal(b.Time())
}
