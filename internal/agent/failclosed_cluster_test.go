package agent

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/rs/zerolog"
)

// The decision table's rows for issue 40's evidence the agent owns (the
// fleet keep list from its own embedded store; a value it cannot decode)
// and for issue 41's cluster keep list (gcagent-cluster's key): each
// world's list is read by the agent's own reader (fleetKeep), then image
// GC plans and deletes by it.

// clusterKeepFor is the fleet keep list after a watch delivered the
// operator's key all (empty) and the cluster values vals at now, on a
// state dir that holds what save wrote.
func clusterKeepFor(t *testing.T, dir string, now func() time.Time, vals map[string][]byte) keepReader {
	t.Helper()
	k := loadFleetKeep(dir, "default", testKeepSource, DefaultKeepListWait, now, zerolog.Nop())
	k.seen = map[string]bool{}
	for _, key := range slices.Sorted(maps.Keys(vals)) {
		k.apply(natsbus.KeepUpdate{Key: key, Value: vals[key]})
	}
	k.apply(natsbus.KeepUpdate{Synced: true})
	return k.KeepList
}

func clusterRows() []failClosedRow {
	app := "registry.example/app:7"
	return []failClosedRow{
		{input: "fleet keep list", state: "known", issue: "40.1", world: "the embedded server's own store holds no keep list bucket (a first install) and its port is taken: known empty, nothing waits",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				k := loadFleetKeep(t.TempDir(), "default", keepSourceEmbedded+", key clusters.default", w.wait, func() time.Time { return w.now }, zerolog.Nop())
				w.keep = k.KeepList
			}), want: "removed"},
		{input: "fleet keep list", state: "unknown", issue: "40.6", world: "never read, and the one value NATS holds has a field of the wrong type: not understood, so not read",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				k := loadFleetKeep(t.TempDir(), "default", testKeepSource, w.wait, func() time.Time { return w.now }, zerolog.Nop())
				k.seen = map[string]bool{}
				_, err := natsbus.DecodeKeep([]byte(`{"patterns": "registry.example/app:*"}`))
				k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, Err: err})
				k.apply(natsbus.KeepUpdate{Synced: true})
				w.keep = k.KeepList
			}), want: "kept: keep-list-unread"},
		{input: "cluster keep list", state: "known", issue: "41.3", world: "gcagent-cluster's head complete and alive, every shard read: a suspended CronJob names the image",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				w.keep = clusterKeepFor(t, t.TempDir(), func() time.Time { return w.now }, clusterValues(t, "default", declared.Complete, w.now, app))
			}), want: "kept: keep-pattern"},
		{input: "cluster keep list", state: "known", world: "no head: no component in this cluster (or uninstalled)",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				w.keep = clusterKeepFor(t, t.TempDir(), func() time.Time { return w.now }, nil)
			}), want: "removed"},
		{input: "cluster keep list", state: "unknown", issue: "41.3", world: "the component's informers are syncing and this node never read a complete list",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				w.keep = clusterKeepFor(t, t.TempDir(), func() time.Time { return w.now }, clusterValues(t, "default", declared.Syncing, w.now))
			}), want: "kept: keep-list-unread"},
		{input: "cluster keep list", state: "stale", issue: "41.3", world: "the component stopped (no heartbeat for a minute); the last complete list, saved in the state dir, names the image",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				dir := t.TempDir()
				then := w.now.Add(-time.Minute)
				clusterKeepFor(t, dir, func() time.Time { return then }, clusterValues(t, "default", declared.Complete, then, app))
				w.keep = clusterKeepFor(t, dir, func() time.Time { return w.now }, clusterValues(t, "default", declared.Complete, then))
			}), want: "kept: keep-pattern"},
		{input: "cluster keep list", state: "stale", world: "a kind the component cannot read: the list published incomplete, without the image; the last complete list had it",
			run: imageRow(app, func(t *testing.T, w *imageWorld) {
				dir := t.TempDir()
				clusterKeepFor(t, dir, func() time.Time { return w.now }, clusterValues(t, "default", declared.Complete, w.now, app))
				w.keep = clusterKeepFor(t, dir, func() time.Time { return w.now }, clusterValues(t, "default", declared.Incomplete, w.now))
			}), want: "kept: keep-pattern"},
	}
}
