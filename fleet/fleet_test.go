package fleet

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

func ce(t *testing.T, node, kind, action, subject string, at time.Time, data any) natsbus.CloudEvent {
	t.Helper()
	ev, err := natsbus.NewEvent("c1", node, natsbus.Action{Kind: kind, Action: action, Subject: subject, Key: at.String() + subject, Data: data}, at)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestFold(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := New(3)
	evs := []natsbus.CloudEvent{
		ce(t, "n1", "agent", "started", "n1", t0, nil),
		ce(t, "n1", "agent", "heartbeat", "n1", t0.Add(time.Minute), map[string]any{"diskUsagePercent": 91, "images": 12, "outbox": 0, "natsMode": "jetstream"}),
		// A gc pass 2h ago is outside the hour; one 10 min ago inside.
		ce(t, "n1", "gc", "completed", "image", t0.Add(-2*time.Hour), map[string]any{"freedBytes": 1 << 30}),
		ce(t, "n1", "gc", "completed", "image", t0.Add(50*time.Minute), map[string]any{"freedBytes": 300 << 20, "trigger": "disk"}),
		ce(t, "n1", "image", "removed", "sha256:aa", t0.Add(50*time.Minute), map[string]any{"bytes": 300 << 20, "reason": "space"}),
		ce(t, "n1", "container", "removed", "c-1", t0.Add(51*time.Minute), map[string]any{"reason": "per-unit-cap"}),
		ce(t, "n2", "gc", "failed", "image", t0.Add(55*time.Minute), map[string]any{"freedBytes": 0, "error": "boom"}),
		ce(t, "n2", "image", "skipped", "sha256:bb", t0.Add(55*time.Minute), map[string]any{"reason": "delete-failed"}),
		// An older heartbeat arriving late does not override the newer one.
		ce(t, "n1", "agent", "heartbeat", "n1", t0.Add(30*time.Second), map[string]any{"diskUsagePercent": 50, "images": 1}),
	}
	for _, ev := range evs {
		f.Apply(ev)
	}
	now := t0.Add(time.Hour)
	rows := f.Rows(now)
	if len(rows) != 2 || rows[0].Node != "n1" || rows[1].Node != "n2" || rows[0].Cluster != "c1" {
		t.Fatalf("rows %+v", rows)
	}
	n1, n2 := rows[0], rows[1]
	if n1.DiskUsagePercent != 91 || n1.Images != 12 || n1.HeartbeatAge != 59*time.Minute || n1.NATSMode != "jetstream" {
		t.Errorf("n1 heartbeat figures: %+v", n1)
	}
	if n1.FreedLastHour != 300<<20 || !n1.LastGC.Equal(t0.Add(50*time.Minute)) || n1.LastGCResult != "completed" {
		t.Errorf("n1 gc figures: %+v", n1)
	}
	if n1.FailuresLastHour != 0 || n1.Removed["image"] != 1 || n1.Removed["container"] != 1 {
		t.Errorf("n1 counts: %+v", n1)
	}
	if n2.DiskUsagePercent != -1 || n2.Images != -1 || n2.HeartbeatAge != -1 || n2.FailuresLastHour != 2 || n2.LastGCResult != "failed" {
		t.Errorf("n2 (no heartbeat, one failed pass, one failed delete): %+v", n2)
	}
	// The tail keeps the newest three actions in time order, without heartbeats.
	tail := f.Tail()
	if len(tail) != 3 || tail[0].Type != "container.removed" || tail[2].Type != "image.skipped" {
		t.Errorf("tail %+v", tail)
	}
	// An hour later nothing is in the window.
	later := f.Rows(now.Add(2 * time.Hour))
	if later[0].FreedLastHour != 0 || later[1].FailuresLastHour != 0 {
		t.Errorf("window did not move: %+v", later)
	}
}

// TestTailFields: a tail line carries the reason, trigger, bytes and error
// of its payload, each from the view of its type.
func TestTailFields(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := New(10)
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "gc", "completed", "image", t0, map[string]any{"bytes": 5, "freedBytes": 7, "trigger": "disk"}),
		ce(t, "n1", "gc", "started", "image", t0.Add(1*time.Second), map[string]any{"bytes": 5, "trigger": "age"}),
		ce(t, "n1", "image", "removed", "sha256:aa", t0.Add(2*time.Second), map[string]any{"bytes": 5, "reason": "space"}),
		ce(t, "n1", "log", "removed", "/var/log/pods/x", t0.Add(3*time.Second), map[string]any{"bytes": 9, "reason": "dangling", "error": "partly"}),
		ce(t, "n1", "agent", "state_reset", "n1", t0.Add(4*time.Second), map[string]any{"error": "bad json"}),
		ce(t, "n1", "agent", "started", "n1", t0.Add(5*time.Second), map[string]any{"version": "v1"}),
		// Data of another shape is read as far as it fits.
		ce(t, "n1", "log", "removed", "/var/log/pods/y", t0.Add(6*time.Second), map[string]any{"bytes": "many", "reason": "gone"}),
	} {
		f.Apply(ev)
	}
	want := []TailLine{
		{Type: "gc.completed", Subject: "image", Trigger: "disk", Bytes: 7, Measured: true},
		{Type: "gc.started", Subject: "image", Trigger: "age", Bytes: 5},
		{Type: "image.removed", Subject: "sha256:aa", Reason: "space", Bytes: 5},
		{Type: "log.removed", Subject: "/var/log/pods/x", Reason: "dangling", Bytes: 9, Measured: true, Error: "partly"},
		{Type: "agent.state_reset", Subject: "n1", Error: "bad json"},
		{Type: "agent.started", Subject: "n1"},
		{Type: "log.removed", Subject: "/var/log/pods/y", Reason: "gone"},
	}
	tail := f.Tail()
	if len(tail) != len(want) {
		t.Fatalf("tail %+v", tail)
	}
	for i, w := range want {
		w.At, w.Node = t0.Add(time.Duration(i)*time.Second), "n1"
		if tail[i] != w {
			t.Errorf("tail[%d] = %+v, want %+v", i, tail[i], w)
		}
	}
	if r := f.Rows(t0.Add(time.Minute))[0]; r.Removed["log"] != 2 || r.Removed["image"] != 1 || r.FreedLastHour != 7 {
		t.Errorf("row %+v", r)
	}
}

func TestSplitSource(t *testing.T) {
	for src, want := range map[string][2]string{
		"gcagent/prod/node-1":    {"prod", "node-1"},
		"gcagent/prod/a/b":       {"prod", "a/b"},
		"somebody/else":          {"?", "somebody/else"},
		"gcagent/only-a-cluster": {"?", "only-a-cluster"},
	} {
		c, n := SplitSource(src)
		if c != want[0] || n != want[1] {
			t.Errorf("%s: %s %s", src, c, n)
		}
	}
}

// TestTailNamesObjects: the action tail names images by their tags
// with the digest shortened, and CRI containers by pod and name.
func TestTailNamesObjects(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	digest := "sha256:37d11ee8042e09d93c100b0ea6632dfac4c441333fb7729bd4925a3f6727b3df"
	f := New(10)
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "image", "removed", digest, t0, map[string]any{"digest": digest,
			"names": []string{"example.test/web:1", "sha256:d06c6b7adb26798a4717c58bbbc3d1b96f1c8780baf9f737bc3277213d6c2848"}, "freedBytes": 1 << 20}),
		ce(t, "n1", "image", "skipped", digest, t0.Add(time.Second), map[string]any{"digest": digest,
			"names": []string{"sha256:d06c6b7adb26798a4717c58bbbc3d1b96f1c8780baf9f737bc3277213d6c2848"}, "reason": "in-use"}),
		ce(t, "n1", "container", "removed", "3f2a9c0d1e2b3c4d5e6f", t0.Add(2*time.Second), map[string]any{
			"podNamespace": "default", "podName": "web-7d9", "containerName": "app"}),
		ce(t, "n1", "container", "removed", "nightly-job", t0.Add(3*time.Second), map[string]any{}),
		ce(t, "n1", "container", "removed", "build-1", t0.Add(4*time.Second), map[string]any{"namespace": "buildkit"}),
		ce(t, "n1", "image", "removed", digest, t0.Add(5*time.Second), map[string]any{"digest": digest, "namespace": "default",
			"names": []string{"example.test/web:1"}}),
	} {
		f.Apply(ev)
	}
	want := []string{
		"example.test/web:1 (sha256:37d11ee8042e)",
		"sha256:37d11ee8042e",
		"default/web-7d9 app (3f2a9c0d1e2b)",
		"nightly-job",
		"buildkit: build-1", // a namespace other than k8s.io is said
		"default: example.test/web:1 (sha256:37d11ee8042e)",
	}
	tail := f.Tail()
	if len(tail) != len(want) {
		t.Fatalf("tail %+v", tail)
	}
	for i, w := range want {
		if tail[i].Subject != w {
			t.Errorf("tail[%d] subject %q, want %q", i, tail[i].Subject, w)
		}
	}
}

// TestDecodeReadsThePublishersPayloads: each view reads the JSON names of
// the type its event is published with, so a renamed field fails here.
func TestDecodeReadsThePublishersPayloads(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	six, seven := 6, 7
	for _, tc := range []struct {
		name, kind, action string
		data               any
		want               any
	}{
		{"image outcome", "image", "removed",
			gc.ImageOutcome{Namespace: "default", Digest: "sha256:aa", Names: []string{"web:1"}, Size: 5, Freed: 4, Reason: gc.ReasonSpace},
			&ImageEvent{ImageOutcome: schema.ImageOutcome{Namespace: "default", Digest: "sha256:aa", Names: []string{"web:1"}, Size: 5, Freed: 4, Reason: "space"}}},
		{"container removal", "container", "removed",
			gc.ContainerRemoval{Namespace: "k8s.io", ID: "c1", PodNamespace: "ns", PodName: "p", ContainerName: "app", Reason: "per-unit-cap"},
			&ContainerEvent{Namespace: "k8s.io", ID: "c1", PodNamespace: "ns", PodName: "p", ContainerName: "app", Reason: "per-unit-cap"}},
		{"log removal", "log", "removed",
			logs.Removal{Reason: "dangling", Bytes: 9, Error: "partly"},
			&LogEvent{Reason: "dangling", Bytes: 9, Error: "partly"}},
		{"pass summary", "gc", "failed",
			map[string]any{"trigger": "disk", "bytes": 5, "freedBytes": 4, "error": "boom"},
			&GCEvent{Trigger: "disk", EstimatedBytes: 5, FreedBytes: 4, Error: "boom"}},
		{"heartbeat", "agent", "heartbeat",
			map[string]any{"diskUsagePercent": 6, "images": 7, "outbox": 2, "natsMode": "core"},
			&Heartbeat{DiskUsagePercent: &six, Images: &seven, Outbox: 2, NATSMode: "core"}},
		{"heartbeat without figures", "agent", "heartbeat", map[string]any{}, &Heartbeat{}},
		{"state reset", "agent", "state_reset", map[string]any{"error": "bad"}, &StateReset{Error: "bad"}},
		{"no data", "gc", "started", nil, &GCEvent{}},
		{"agent.started: nothing read", "agent", "started", map[string]any{"version": "v1"}, nil},
		{"unknown kind", "widget", "removed", map[string]any{"reason": "x"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(ce(t, "n1", tc.kind, tc.action, "s", at, tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				g, _ := json.Marshal(got)
				t.Errorf("Decode = %T %s, want %+v", got, g, tc.want)
			}
		})
	}
}

// TestDecodeOtherShape: data that does not fit the view is an error, and
// the view holds what fitted.
func TestDecodeOtherShape(t *testing.T) {
	ev := ce(t, "n1", "image", "removed", "s", time.Now(), map[string]any{"reason": "space", "names": "not-a-list"})
	got, err := Decode(ev)
	if err == nil {
		t.Fatal("no error")
	}
	if d, ok := got.(*ImageEvent); !ok || d.Reason != "space" {
		t.Errorf("Decode = %#v", got)
	}
	ev.Data = []byte(`"a string"`)
	if got, err := Decode(ev); err == nil || !reflect.DeepEqual(got, &ImageEvent{}) {
		t.Errorf("Decode of a string = %#v, %v", got, err)
	}
}

// TestRegrets: image.regretted counts once per event id, per cluster
// against its image removals, and per image across nodes.
func TestRegrets(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	f := New(10)
	ev := func(cluster, node, action, digest string, at time.Time, data any) natsbus.CloudEvent {
		e, err := natsbus.NewEvent(cluster, node, natsbus.Action{Kind: "image", Action: action, Subject: digest, Key: at.String() + digest, Data: data}, at)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	regret := func(name, digest string, bytes int64, after float64) schema.ImageRegret {
		return schema.ImageRegret{Namespace: "k8s.io", Digest: digest, Names: []string{name}, Bytes: bytes, ReturnAfterSeconds: after, Rule: "space", Trigger: "disk"}
	}
	evs := []natsbus.CloudEvent{
		ev("prod", "n1", "removed", "sha256:app", t0, map[string]any{"bytes": 100}),
		ev("prod", "n1", "removed", "sha256:db", t0, map[string]any{"bytes": 50}),
		ev("prod", "n2", "removed", "sha256:app", t0, map[string]any{"bytes": 100}),
		ev("prod", "n2", "removed", "sha256:x", t0, map[string]any{"bytes": 10}),
		ev("prod", "n1", "regretted", "sha256:app", t0.Add(time.Minute), regret("app:1", "sha256:app", 100, 60)),
		ev("prod", "n2", "regretted", "sha256:app", t0.Add(2*time.Minute), regret("app:1", "sha256:app", 100, 30)),
		ev("dev", "d1", "removed", "sha256:db", t0, map[string]any{"bytes": 50}),
		ev("dev", "d1", "regretted", "sha256:db", t0.Add(time.Minute), regret("db:2", "sha256:db", 50, 5)),
	}
	for _, e := range evs {
		f.Apply(e)
	}
	f.Apply(evs[4]) // replayed and live: the same event twice
	got := f.ClusterRegrets()
	want := []ClusterRegrets{{Cluster: "dev", Regrets: 1, Bytes: 50, Removed: 1, Rate: 1}, {Cluster: "prod", Regrets: 2, Bytes: 200, Removed: 4, Rate: 0.5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("clusters %+v, want %+v", got, want)
	}
	top := f.TopRegretted(1)
	if len(top) != 1 || top[0] != (ImageRegrets{Image: imageLabel([]string{"app:1"}, "sha256:app"), Regrets: 2, Bytes: 200, Nodes: 2, ReturnAfterSeconds: 30}) {
		t.Fatalf("top %+v", top)
	}
	if tail := f.Tail(); tail[len(tail)-1].Type != "image.regretted" || tail[len(tail)-1].Bytes != 100 {
		t.Fatalf("tail %+v", tail[len(tail)-1])
	}
}

// TestTailMarksDryRun: a dry run's actions say they are one: its
// would-removes (image.skipped with reason dry-run, whose reason shown is
// the rule the removal would have; container.skipped with the removal's)
// and its passes. On d7dd547 they looked like a run's skips.
func TestTailMarksDryRun(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := New(10)
	for _, ev := range []natsbus.CloudEvent{
		ce(t, "n1", "image", "skipped", "sha256:aa", t0, map[string]any{"bytes": 5, "reason": "dry-run", "rule": "space", "dryRun": true}),
		ce(t, "n1", "image", "skipped", "sha256:bb", t0.Add(time.Second), map[string]any{"bytes": 5, "reason": "too-young", "rule": "space", "dryRun": true}),
		ce(t, "n1", "container", "skipped", "c1", t0.Add(2*time.Second), map[string]any{"reason": "ttl-expired", "dryRun": true, "skipReason": "dry-run"}),
		ce(t, "n1", "gc", "completed", "image", t0.Add(3*time.Second), map[string]any{"bytes": 5, "trigger": "disk", "dryRun": true}),
	} {
		f.Apply(ev)
	}
	want := []struct {
		reason string
		dry    bool
	}{{"space", true}, {"too-young", false}, {"ttl-expired", true}, {"", true}}
	tail := f.Tail()
	for i, w := range want {
		if i >= len(tail) || tail[i].Reason != w.reason || tail[i].DryRun != w.dry {
			t.Errorf("tail[%d] = %+v, want reason %q dry run %v", i, tail, w.reason, w.dry)
		}
	}
}
