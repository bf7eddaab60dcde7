package fleet

import (
	"slices"
	"testing"
	"time"

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
