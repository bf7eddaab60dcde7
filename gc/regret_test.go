package gc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// TestRegretReportedOnce: an image deleted by GC that comes back is
// published once as image.regretted with the deletion's figures, counted,
// and marked reported in the projection; a failed publish is retried.
func TestRegretReportedOnce(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	live, err := projection.NewLive(projection.LiveOptions{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	record := func(_ context.Context, ns string, ev events.Event) error {
		if ns != events.CRINamespace {
			t.Errorf("recorded in namespace %q", ns)
		}
		live.Apply(ev)
		return nil
	}
	pub := &fakePublisher{err: errors.New("outbox full")}
	reg := prometheus.NewRegistry()
	r, err := NewRegretReporter(live, pub, record, func() time.Time { return t0.Add(time.Hour) }, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	live.Apply(events.ImageUpserted{At: t0, Name: "app.test/a:1", Digest: "sha256:a", Size: 5 << 20},
		events.ImageDeleted{At: t0.Add(time.Minute), Name: "app.test/a:1"},
		events.ImageCollected{At: t0.Add(time.Minute), Digest: "sha256:a", Names: []string{"app.test/a:1"}, Size: 5 << 20,
			Freed: 6 << 20, Rule: "space", Trigger: "disk", RegretUntil: t0.Add(24 * time.Hour)})
	if n := r.Report(context.Background()); n != 0 || len(pub.Actions()) != 0 {
		t.Fatalf("reported %d before the image came back: %+v", n, pub.Actions())
	}
	live.Apply(events.ImageUpserted{At: t0.Add(11 * time.Minute), Name: "app.test/a:1", Digest: "sha256:a", Size: 5 << 20})
	if n := r.Report(context.Background()); n != 0 {
		t.Fatalf("reported %d while publishing fails", n)
	}
	pub.mu.Lock()
	pub.err, pub.actions = nil, nil
	pub.mu.Unlock()
	if n := r.Report(context.Background()); n != 1 {
		t.Fatalf("reported %d, want 1", n)
	}
	if n := r.Report(context.Background()); n != 0 {
		t.Fatalf("reported again: %d", n)
	}
	acts := pub.Actions()
	if len(acts) != 1 || acts[0].Kind != schema.KindImage || acts[0].Action != schema.ActionRegretted {
		t.Fatalf("actions %+v", acts)
	}
	d := acts[0].Data.(schema.ImageRegret)
	if d.Bytes != 5<<20 || d.FreedBytes != 6<<20 || d.ReturnAfterSeconds != 600 || d.Rule != "space" || d.Trigger != "disk" ||
		d.ReturnedAs != "app.test/a:1" || !d.DeletedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("payload %+v", d)
	}
	if got := testutil.ToFloat64(r.regrets.WithLabelValues(events.CRINamespace)); got != 1 {
		t.Fatalf("gcagent_image_gc_regret_total %v", got)
	}
	if got := testutil.ToFloat64(r.regretBytes.WithLabelValues(events.CRINamespace)); got != 5<<20 {
		t.Fatalf("gcagent_image_gc_regret_bytes_total %v", got)
	}
	if regrets := live.Snapshot().Regrets(); len(regrets) != 0 {
		t.Fatalf("still unreported in the projection: %+v", regrets)
	}
}
