package gc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
)

// t0 is the fixed origin of every test clock.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at is t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// build applies evs to a new state through the real reducer.
func build(evs ...events.Event) *projection.State {
	s := projection.New()
	for _, ev := range evs {
		s.Apply(ev)
	}
	return s
}

// pull says that name points at digest since t0+d; labels are key=value.
func pull(d time.Duration, name, digest string, size int64, labels ...string) events.ImageUpserted {
	l := map[string]string{}
	for _, kv := range labels {
		k, v, _ := strings.Cut(kv, "=")
		l[k] = v
	}
	return events.ImageUpserted{At: at(d), Name: name, Digest: digest, Size: size, Labels: l}
}

// native creates a plain containerd container (no CRI kind) at t0+d.
func native(d time.Duration, id, image string) events.ContainerUpserted {
	return events.ContainerUpserted{At: at(d), ID: id, Image: image, Created: at(d)}
}

// sandbox creates a CRI sandbox of pod uid at t0+d.
func sandbox(d time.Duration, id, uid string) events.ContainerUpserted {
	return events.ContainerUpserted{At: at(d), ID: id, Image: "pause:3.10", CRIKind: projection.KindSandbox,
		PodUID: uid, PodName: "pod-" + uid, PodNamespace: "default", Created: at(d)}
}

// criContainer creates CRI container name of pod uid in sandbox sb at t0+d.
func criContainer(d time.Duration, id, image, uid, name, sb string) events.ContainerUpserted {
	return events.ContainerUpserted{At: at(d), ID: id, Image: image, CRIKind: projection.KindContainer,
		PodUID: uid, PodName: "pod-" + uid, PodNamespace: "default", ContainerName: name, SandboxID: sb, Created: at(d)}
}

// start starts a run; each run gets its own pid, as on a real node.
func start(d time.Duration, id string) events.TaskStarted {
	return events.TaskStarted{At: at(d), ContainerID: id, Pid: 1000 + uint32(d/time.Second)}
}

func exit(d time.Duration, id string) events.TaskExited {
	return events.TaskExited{At: at(d), ContainerID: id, ExitedAt: at(d)}
}

// collect is a client deleting the task of id at t0+d (it read the exit
// status).
func collect(d time.Duration, id string) events.TaskExited {
	return events.TaskExited{At: at(d), ContainerID: id, Collected: true}
}

// gone is the exit of id at t0+d, collected by its client at once (ctr run
// deletes the task as soon as it exits).
func gone(d time.Duration, id string) events.TaskExited {
	return events.TaskExited{At: at(d), ContainerID: id, ExitedAt: at(d), Collected: true}
}

// restarted is dead(), for a container whose restart policy (nerdctl
// --restart, containerd's restart monitor) wants it running.
func restarted(d, ran time.Duration, id, image string) []events.Event {
	evs := dead(d, ran, id, image)
	c := evs[0].(events.ContainerUpserted)
	c.RestartManaged = true
	evs[0] = c
	return evs
}

func remove(d time.Duration, id string) events.ContainerDeleted {
	return events.ContainerDeleted{At: at(d), ID: id}
}

// dead creates, starts and ends a plain container: created at t0+d, exited
// at t0+d+ran.
func dead(d, ran time.Duration, id, image string) []events.Event {
	return []events.Event{native(d, id, image), start(d, id), exit(d+ran, id)}
}

// solo is a dead CRI container alone in its evict unit: the caps' unit of
// one, now that plain containers go by their TTL instead.
func solo(d, ran time.Duration, id, image string) []events.Event {
	return criDead(d, ran, id, image, "u-"+id, "app", "")
}

// flat joins event groups.
func flat(groups ...any) []events.Event {
	var out []events.Event
	for _, g := range groups {
		switch g := g.(type) {
		case events.Event:
			out = append(out, g)
		case []events.Event:
			out = append(out, g...)
		default:
			panic(fmt.Sprintf("flat: %T", g))
		}
	}
	return out
}

// criDead creates, starts and ends CRI container name of pod uid in sandbox
// sb: created at t0+d, exited at t0+d+ran.
func criDead(d, ran time.Duration, id, image, uid, name, sb string) []events.Event {
	return []events.Event{criContainer(d, id, image, uid, name, sb), start(d, id), exit(d+ran, id)}
}

// wantError fails t unless err is nil for want "", or contains want.
func wantError(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("Validate() = %v, want nil", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("Validate() = %v, want an error containing %q", err, want)
	}
}

// sameJSON reports whether a and b encode to the same JSON.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}
