package fleet

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
)

// TestJudge: each reason a node needs a look, and none for a healthy node.
func TestJudge(t *testing.T) {
	ok := Row{DiskUsagePercent: 50, HighThreshold: 85, ReclaimableBytes: 1, Synced: true, HeartbeatAge: time.Second,
		Interval: 30 * time.Second, NATSMode: "jetstream"}
	with := func(f func(*Row)) Row { r := ok; f(&r); return r }
	for _, tc := range []struct {
		name string
		row  Row
		want []string
	}{
		{"healthy", ok, nil},
		{"over high", with(func(r *Row) { r.DiskUsagePercent = 90 }), []string{ReasonOverHigh}},
		{"unrelievable", with(func(r *Row) { r.DiskUsagePercent = 90; r.ReclaimableBytes = 0 }), []string{ReasonUnrelievable}},
		{"not synced is not unrelievable", with(func(r *Row) { r.DiskUsagePercent = 90; r.ReclaimableBytes = 0; r.Synced = false }), []string{ReasonOverHigh}},
		{"threshold 100 disables", with(func(r *Row) { r.DiskUsagePercent = 100; r.HighThreshold = 100 }), nil},
		{"gc failed", with(func(r *Row) { r.LastGCResult = "failed" }), []string{ReasonGCFailed}},
		{"stale", with(func(r *Row) { r.HeartbeatAge = 91 * time.Second }), []string{ReasonStale}},
		{"stale by its own interval", with(func(r *Row) { r.Interval = 5 * time.Second; r.HeartbeatAge = 16 * time.Second }), []string{ReasonStale}},
		{"never heard", with(func(r *Row) { r.HeartbeatAge = -1 }), []string{ReasonStale}},
		{"starting", with(func(r *Row) { r.HeartbeatAge = -1; r.Starting = true }), nil},
		{"starting again after a restart", with(func(r *Row) { r.HeartbeatAge = 10 * time.Minute; r.Starting = true }), nil},
		{"outbox growing", with(func(r *Row) { r.OutboxGrowing = true }), []string{ReasonOutboxGrowing}},
		{"core mode", with(func(r *Row) { r.NATSMode = "core" }), []string{ReasonNotJetStream}},
	} {
		if got := Judge(tc.row); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestApplyStatusOutboxGrowing: a node's outbox that rises between two
// last values is growing; an older value changes nothing.
func TestApplyStatusOutboxGrowing(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f := New(5)
	st := func(at time.Time, outbox int) schema.NodeStatus {
		return schema.NodeStatus{Cluster: "c", Node: "n", At: at, HeartbeatIntervalSeconds: 30, ImageGCHighThreshold: 85,
			Heartbeat: schema.Heartbeat{DiskUsagePercent: 10, Outbox: outbox, NATSMode: "disconnected"}}
	}
	f.ApplyStatus(st(t0, 5))
	f.ApplyStatus(st(t0.Add(30*time.Second), 9))
	f.ApplyStatus(st(t0.Add(-time.Minute), 0)) // older: ignored
	rows := f.Rows(t0.Add(40 * time.Second))
	if len(rows) != 1 || rows[0].Outbox != 9 || !rows[0].OutboxGrowing || rows[0].Interval != 30*time.Second {
		t.Fatalf("rows %+v", rows)
	}
	looks := Looks(rows)
	if len(looks) != 1 || !slices.Equal(looks[0].Reasons, []string{ReasonOutboxGrowing, ReasonNotJetStream}) {
		t.Errorf("looks %+v", looks)
	}
	if tot := Sum(rows, looks); tot.Nodes != 1 || tot.Outbox != 9 || tot.ByReason[ReasonOutboxGrowing] != 1 {
		t.Errorf("totals %+v", tot)
	}
}

// TestStarting: a node heard from but without a heartbeat since its agent
// started is starting, not stale, for 3 heartbeat intervals; then stale.
// A heartbeat or a last value ends it; a restart starts it again.
func TestStarting(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := func(node, kind, action string, at time.Time) natsbus.CloudEvent {
		e, err := natsbus.NewEvent("c1", node, natsbus.Action{Kind: kind, Action: action, Subject: node, Key: at.String() + kind + action}, at)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	f := New(5)
	f.Apply(ev("new", "agent", "started", t0))                                                            // no heartbeat yet
	f.Apply(ev("quiet", "image", "removed", t0))                                                          // heard of, no start, no heartbeat
	f.Apply(ev("back", "agent", "heartbeat", t0.Add(-10*time.Minute)))                                    // then restarted
	f.Apply(ev("back", "agent", "started", t0))                                                           //
	f.Apply(ev("beat", "agent", "started", t0))                                                           // then a heartbeat
	f.Apply(ev("beat", "agent", "heartbeat", t0.Add(time.Second)))                                        //
	f.ApplyStatus(schema.NodeStatus{Cluster: "c1", Node: "valued", At: t0, HeartbeatIntervalSeconds: 30}) // a last value is a heartbeat
	state := func(now time.Time) map[string]string {
		out := map[string]string{}
		rows := f.Rows(now)
		for _, r := range rows {
			out[r.Node] = "ok"
			if r.Starting {
				out[r.Node] = "starting"
			}
		}
		for _, l := range Looks(rows) {
			if slices.Contains(l.Reasons, ReasonStale) {
				out[l.Node] = "stale"
			}
		}
		return out
	}
	if got, want := state(t0.Add(20*time.Second)), map[string]string{"new": "starting", "quiet": "starting", "back": "starting",
		"beat": "ok", "valued": "ok"}; !maps.Equal(got, want) {
		t.Errorf("20 s after the start: %v, want %v", got, want)
	}
	if tot := Sum(f.Rows(t0.Add(20*time.Second)), nil); tot.Starting != 3 || !strings.Contains(tot.String(), "starting 3") {
		t.Errorf("totals %+v: %s", tot, tot)
	}
	if got, want := state(t0.Add(91*time.Second)), map[string]string{"new": "stale", "quiet": "stale", "back": "stale",
		"beat": "ok", "valued": "stale"}; !maps.Equal(got, want) {
		t.Errorf("91 s after the start (3 intervals): %v, want %v", got, want)
	}
}
