package projection

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/gcagent/gcagent/events"
	"github.com/prometheus/client_golang/prometheus"
)

// TestContainerRecordSize: a container record fits the allocator's
// 288-byte size class (it was 352 before the state became a byte and the
// image volumes went behind a pointer); a busy node holds tens of
// thousands of them.
func TestContainerRecordSize(t *testing.T) {
	if got := unsafe.Sizeof(Container{}); got > 288 {
		t.Fatalf("Container is %d bytes, over the 288-byte size class", got)
	}
}

// TestContainerStateText: a state reads and writes as the name it had when
// it was a string, in JSON and in the metrics' labels; an unknown name is
// an error.
func TestContainerStateText(t *testing.T) {
	for st, name := range map[ContainerState]string{0: "", StateCreated: "created", StateRunning: "running", StateExited: "exited"} {
		b, err := json.Marshal(st)
		if err != nil || string(b) != `"`+name+`"` {
			t.Errorf("%v: JSON %s %v, want %q", st, b, err, name)
		}
		var back ContainerState
		if err := json.Unmarshal(b, &back); err != nil || back != st || back.String() != name {
			t.Errorf("%s: read back %v %v", b, back, err)
		}
	}
	var st ContainerState
	if err := json.Unmarshal([]byte(`"paused"`), &st); err == nil {
		t.Errorf(`"paused" read as %v, want an error`, st)
	}
	if _, err := json.Marshal(ContainerState(9)); err == nil {
		t.Error("state 9 written, want an error")
	}

	reg := prometheus.NewRegistry()
	sp, err := NewSpaces(SpacesOptions{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0).UTC()
	sp.Apply(events.Scoped{Namespace: "k8s.io", Event: events.Listing{At: t0,
		Containers: []events.ContainerUpserted{{At: t0, ID: "c1", Image: "a:1"}, {At: t0, ID: "c2", Image: "a:1"}},
		Tasks:      []events.Task{{ContainerID: "c2", Pid: 7, Status: events.TaskRunning}}}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "gcagent_projection_containers" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"created": 1, "running": 1, "exited": 0}
	if !maps.Equal(got, want) {
		t.Errorf("gcagent_projection_containers by state %v, want %v", got, want)
	}
}

// TestContainerJSONKeepsVolumes: a container's image volumes, behind a
// pointer, are written and read as the two fields they were, whether the
// record is held by pointer or by value.
func TestContainerJSONKeepsVolumes(t *testing.T) {
	c := &Container{ID: "c1", State: StateRunning}
	c.setVolumes([]string{"sha256:v1"}, []string{"sha256:vc"})
	for _, v := range []any{c, *c} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var back Container
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if back.ID != "c1" || back.State != StateRunning || !slices.Equal(back.VolumeImageIDs(), []string{"sha256:v1"}) ||
			!slices.Equal(back.VolumeChains(), []string{"sha256:vc"}) {
			t.Errorf("%T: %s read back as %+v", v, b, back)
		}
	}
}
