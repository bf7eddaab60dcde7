package nodeevents

import (
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

var at = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func ev(t *testing.T, node string, a schema.Action) natsbus.CloudEvent {
	t.Helper()
	if a.Key == "" {
		a.Key = "k"
	}
	e, err := natsbus.NewEvent("prod", node, a, at)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestMap: each shown action becomes the Event a user reads on its Node;
// skips, dry runs, passes that did nothing and heartbeats become none.
func TestMap(t *testing.T) {
	const node = "worker-1.example.com"
	img := schema.ImageOutcome{Namespace: "k8s.io", Digest: "sha256:0123456789abcdef0123", Names: []string{"docker.io/library/app:1", "sha256:aaa"},
		Size: 120 << 20, Freed: 240 << 20, Rule: "space", LastUsed: at.Add(-3 * time.Hour)}
	cases := []struct {
		name        string
		a           schema.Action
		reason, typ string
		note        []string // substrings
	}{
		{"image removed", schema.Action{Kind: "image", Action: "removed", Subject: img.Digest, Data: schema.ImageEvent{ImageOutcome: img}},
			ReasonImageRemoved, Normal, []string{"docker.io/library/app:1 (sha256:0123456789ab)", "240.0 MiB freed", "space, unused for 3h0m0s"}},
		{"container removed", schema.Action{Kind: "container", Action: "removed", Subject: "abcdef0123456789",
			Data: schema.ContainerRemoval{Namespace: "k8s.io", PodNamespace: "shop", PodName: "web-1", ContainerName: "app", Reason: "pod-deleted",
				Logs: &schema.ContainerLogs{Files: []string{"a", "b"}, Bytes: 4096}}},
			ReasonContainerRemoved, Normal, []string{"shop/web-1 app (abcdef012345)", "pod-deleted", "2 log files (4.0 KiB)"}},
		{"pod dir removed", schema.Action{Kind: "log", Action: "removed", Subject: "x", Data: schema.LogRemoval{Kind: "poddir", Dir: "/var/log/pods", Name: "shop_web_u1", Reason: "pod-gone", Bytes: 3 << 20}},
			ReasonLogRemoved, Normal, []string{"orphaned pod log dir /var/log/pods/shop_web_u1 (pod-gone, 3.0 MiB)"}},
		{"pass", schema.Action{Kind: "gc", Action: "completed", Data: schema.GCPass{Trigger: "disk", Usage: 91, UsageAfter: 79, Removed: 3, FreedBytes: 1 << 30}},
			ReasonImageGCCompleted, Normal, []string{"removed 3 images, 1.0 GiB freed; disk 91% → 79%"}},
		{"shortfall", schema.Action{Kind: "gc", Action: "completed", Data: schema.GCPass{Trigger: "disk", Usage: 95, UsageAfter: 93, AmountToFree: 5 << 30,
			EstimatedBytes: 1 << 30, Removed: 1, FreedBytes: 900 << 20, Shortfall: "2 images too young, 4 in use"}},
			ReasonFreeDiskSpaceFailed, Warning, []string{"Attempted to free 5368709120 bytes, but only found 1073741824 bytes eligible to free", "2 images too young"}},
		{"failed", schema.Action{Kind: "gc", Action: "failed", Data: schema.GCPass{Trigger: "disk", Usage: 90, Error: "statfs: input/output error"}},
			ReasonImageGCFailed, Warning, []string{"statfs: input/output error"}},
		{"regret", schema.Action{Kind: "image", Action: "regretted", Data: schema.ImageRegret{Namespace: "k8s.io", Digest: "sha256:0123456789abcdef0123",
			Names: []string{"docker.io/library/app:1"}, ReturnAfterSeconds: 250, Bytes: 120 << 20, Rule: "space", Trigger: "disk"}},
			ReasonImageRegretted, Warning, []string{"came back 4m10s after", "re-pull of 120.0 MiB"}},
		{"reset", schema.Action{Kind: "agent", Action: "state_reset", Data: schema.StateReset{Error: "unexpected EOF"}},
			ReasonGCStateReset, Warning, []string{"LRU history is lost (unexpected EOF)"}},
	}
	for _, c := range cases {
		e, ok, err := Map(ev(t, node, c.a))
		if err != nil || !ok {
			t.Errorf("%s: ok %v err %v", c.name, ok, err)
			continue
		}
		if e.Node != node || e.Reason != c.reason || e.Type != c.typ || !e.Time.Equal(at) || e.Action == "" || ActionOf(e.Reason) != e.Action {
			t.Errorf("%s: %+v", c.name, e)
		}
		for _, s := range c.note {
			if !strings.Contains(e.Note, s) {
				t.Errorf("%s: note %q lacks %q", c.name, e.Note, s)
			}
		}
		if strings.Contains(e.Note, "\n") {
			t.Errorf("%s: note has a newline", c.name)
		}
	}
	for _, a := range []schema.Action{
		{Kind: "image", Action: "skipped", Data: schema.ImageEvent{ImageOutcome: img}},
		{Kind: "image", Action: "removed", Data: schema.ImageEvent{ImageOutcome: img, DryRun: true}},
		{Kind: "gc", Action: "completed", Data: schema.GCPass{Trigger: "disk", Usage: 50}},
		{Kind: "gc", Action: "started", Data: schema.GCPass{}},
		{Kind: "agent", Action: "heartbeat", Data: schema.Heartbeat{}},
	} {
		if e, ok, err := Map(ev(t, node, a)); ok || err != nil {
			t.Errorf("%s.%s shown: %+v %v", a.Kind, a.Action, e, err)
		}
	}
	bad := ev(t, node, schema.Action{Kind: "image", Action: "removed"})
	bad.Data = []byte(`{"names": 7}`)
	if _, _, err := Map(bad); err == nil {
		t.Error("undecodable data: no error")
	}
	bad = ev(t, node, schema.Action{Kind: "image", Action: "removed", Data: schema.ImageEvent{ImageOutcome: img}})
	bad.Source = "elsewhere"
	if _, _, err := Map(bad); err == nil {
		t.Error("a foreign source: no error")
	}
}
