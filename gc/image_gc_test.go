package gc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/projection"
)

// fakeProjection serves a State the test mutates between calls.
type fakeProjection struct {
	state *projection.State
	subs  int
}

var (
	_ imageProjection = (*fakeProjection)(nil)
	_ imageProjection = (*projection.Live)(nil)
	_ imageProjection = (*projection.Spaces)(nil)
)

func (p *fakeProjection) ViewAll(fn func([]*projection.State)) { fn([]*projection.State{p.state}) }
func (p *fakeProjection) Synced() bool                         { return p.state.Synced }
func (p *fakeProjection) Subscribe() <-chan struct{} {
	p.subs++
	return make(chan struct{})
}

// imagePublisher records actions.
type imagePublisher struct {
	mu      sync.Mutex
	actions []Action
}

func (p *imagePublisher) Publish(a Action) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = append(p.actions, a)
	return nil
}

func (p *imagePublisher) keys(kind, action string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.actions {
		if a.Kind == kind && a.Action == action {
			out = append(out, a.Key)
		}
	}
	return out
}

// fakeClock is a settable clock.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time                  { return c.now }
func (c *fakeClock) Step(d time.Duration)            { c.now = c.now.Add(d) }
func (c *fakeClock) Set(t time.Time)                 { c.now = t }
func (c *fakeClock) Since(d time.Duration) time.Time { return c.now.Add(-d) }

// imageGCConfig is an ImageGC's deps and options in one, for tests that
// change either.
type imageGCConfig struct {
	ImageGCDeps
	ImageGCOptions
}

func newImageGC(t *testing.T, n *node, p ImagePolicy, mod func(*imageGCConfig)) (*ImageGC, *imagePublisher, *fakeClock, *prometheus.Registry) {
	t.Helper()
	pub, clk, reg := &imagePublisher{}, &fakeClock{now: at(time.Hour)}, prometheus.NewRegistry()
	o := imageGCConfig{
		ImageGCDeps:    ImageGCDeps{Projection: &fakeProjection{state: n.state}, Runtime: n.rt, Disk: n.disk, Publisher: pub},
		ImageGCOptions: ImageGCOptions{Policy: p, Clock: clock.System(clk.Now), Registerer: reg},
	}
	if mod != nil {
		mod(&o)
	}
	if !o.DryRun && o.Deletes == nil {
		o.Deletes = testDeletes1(t, o.Publisher, n.rt)
	}
	return mustImageGC(t, o.ImageGCDeps, o.ImageGCOptions), pub, clk, reg
}

func TestImageGCPassPublishesAndCounts(t *testing.T) {
	n := newNode()
	g, pub, clk, reg := newImageGC(t, n, policy8070, nil)
	pass := g.Pass(context.Background(), "disk")

	wantRemoved := []string{digestOf("a"), digestOf("b")}
	var got []string
	for _, o := range pass.Removed {
		got = append(got, o.Digest)
	}
	if !slices.Equal(got, wantRemoved) {
		t.Fatalf("removed %v, want %v", got, wantRemoved)
	}
	if !pass.Triggered || !pass.LowReached || pass.UsageAfter != 74 || pass.FreedBytes != 16*mib || pass.EstimatedBytes != 8*mib {
		t.Errorf("pass %+v", pass)
	}
	// Keys: digest@firstSeen for a removal; plus the pass start for a skip.
	first := strconv.FormatInt(at(0).UnixNano(), 10)
	if k := pub.keys("image", ActionRemoved); !slices.Equal(k, []string{digestOf("a") + "@" + first, digestOf("b") + "@" + first}) {
		t.Errorf("removed keys %v", k)
	}
	passKey := "image@" + strconv.FormatInt(clk.now.UnixNano(), 10)
	if k := pub.keys("image", ActionSkipped); !slices.Equal(k, []string{digestOf("c") + "@" + first + "/" + strconv.FormatInt(clk.now.UnixNano(), 10)}) {
		t.Errorf("skipped keys %v", k)
	}
	if s, c := pub.keys("gc", "started"), pub.keys("gc", "completed"); !slices.Equal(s, []string{passKey}) || !slices.Equal(c, []string{passKey}) {
		t.Errorf("pass keys started %v completed %v, want %s", s, c, passKey)
	}
	if v := testutil.ToFloat64(g.m.removed.WithLabelValues("", "space")); v != 2 {
		t.Errorf("images removed metric = %v", v)
	}
	if v := testutil.ToFloat64(g.m.bytes.WithLabelValues("", "space", "measured")); v != 16*mib {
		t.Errorf("measured bytes metric = %v", v)
	}
	if v := testutil.ToFloat64(g.m.skipped.WithLabelValues(string(ReasonLowReached))); v != 1 {
		t.Errorf("skips metric = %v", v)
	}
	// Every trigger and result exists from the start; one pass was counted.
	if n, err := testutil.GatherAndCount(reg, "gcagent_image_gc_passes_total"); err != nil || n != len(imageTriggers)*len(imagePassResults) {
		t.Errorf("passes series %d %v", n, err)
	}
	if v := testutil.ToFloat64(g.m.passes.WithLabelValues("disk", "completed")); v != 1 {
		t.Errorf("passes counted %v, want 1", v)
	}
	// KEP-6053's figures: the bytes the pass set out to free, that it met
	// the low threshold (no shortfall), what it kept and why, its duration.
	if v := testutil.ToFloat64(g.m.target.WithLabelValues("disk")); v != float64(pass.AmountToFree) || v <= 0 {
		t.Errorf("target bytes %v, want the pass's amount to free %d", v, pass.AmountToFree)
	}
	if v := testutil.ToFloat64(g.m.short.WithLabelValues("disk")); v != 0 {
		t.Errorf("shortfall passes %v", v)
	}
	if n, err := testutil.GatherAndCount(reg, "gcagent_image_gc_pass_duration_seconds"); err != nil || n != 1 {
		t.Errorf("pass duration series %d %v", n, err)
	}
	st := g.Status()
	if st.Passes != 1 || st.LastPass == nil || len(st.LastPass.Removed) != 2 {
		t.Errorf("status %+v", st)
	}

	// The same pass again (a retry after a crash) publishes the same keys.
	n2 := newNode()
	g2, pub2, _, _ := newImageGC(t, n2, policy8070, nil)
	g2.Pass(context.Background(), "disk")
	if !slices.Equal(pub.keys("image", ActionRemoved), pub2.keys("image", ActionRemoved)) {
		t.Errorf("keys not deterministic: %v vs %v", pub.keys("image", ActionRemoved), pub2.keys("image", ActionRemoved))
	}
}

func TestImageGCFailedPass(t *testing.T) {
	n := newNode()
	n.rt.InjectError("remove", digestOf("a"), errors.New("boom"))
	g, pub, _, _ := newImageGC(t, n, policy8070, nil)
	pass := g.Pass(context.Background(), "disk")
	if pass.Error == "" || len(pub.keys("gc", "failed")) != 1 || len(pub.keys("gc", "completed")) != 0 {
		t.Fatalf("pass error %q, failed %v", pass.Error, pub.keys("gc", "failed"))
	}
}

func TestImageGCSandboxImages(t *testing.T) {
	t.Run("learned from CRI", func(t *testing.T) {
		n := newNode() // a is the least recently used
		calls := 0
		g, _, _, _ := newImageGC(t, n, policy8070, func(o *imageGCConfig) {
			o.LearnSandboxImages = func(context.Context) ([]string, error) {
				calls++
				return []string{"example.test/a:1"}, nil
			}
		})
		pass := g.Pass(context.Background(), "disk")
		if slices.Contains(n.rt.Removed(), digestOf("a")) {
			t.Fatalf("removed the sandbox image: %v", n.rt.Removed())
		}
		if len(pass.Removed) == 0 {
			t.Fatalf("removed nothing")
		}
		if st := g.Status(); !slices.Equal(st.SandboxImages, []string{"example.test/a:1"}) {
			t.Errorf("status sandbox images %v", st.SandboxImages)
		}
		g.Pass(context.Background(), "disk")
		if calls != 1 {
			t.Errorf("asked CRI %d times within the relearn interval", calls)
		}
	})
	t.Run("retried until CRI answers", func(t *testing.T) {
		n := newNode()
		calls := 0
		g, _, _, _ := newImageGC(t, n, policy8070, func(o *imageGCConfig) {
			o.LearnSandboxImages = func(context.Context) ([]string, error) {
				calls++
				return nil, errors.New("cri: unavailable")
			}
		})
		g.Pass(context.Background(), "disk")
		g.Pass(context.Background(), "disk")
		if calls != 2 {
			t.Errorf("asked CRI %d times, want once per pass until it answers", calls)
		}
	})
	t.Run("image of a sandbox that is gone", func(t *testing.T) {
		n := newNode()
		// A pod ran on b's image as its sandbox, then went away.
		n.state.Apply(sandbox(2*h, "sb1", "uid-1"))
		n.state.Apply(events.ContainerUpserted{At: at(2 * h), ID: "sb1", Image: "example.test/b:1",
			CRIKind: projection.KindSandbox, PodUID: "uid-1", Created: at(2 * h)})
		g, _, _, _ := newImageGC(t, n, policy8070, nil)
		g.Pass(context.Background(), "disk") // sees the sandbox: in use anyway
		n.state.Apply(remove(3*h, "sb1"))
		n.disk.available = 0
		g.Pass(context.Background(), "disk")
		if slices.Contains(n.rt.Removed(), digestOf("b")) {
			t.Fatalf("removed an image pods were started from: %v", n.rt.Removed())
		}
	})
}

func TestImageGCDryRunDeletesNothing(t *testing.T) {
	n := newNode()
	g, pub, _, _ := newImageGC(t, n, policy8070, func(o *imageGCConfig) { o.DryRun = true })
	pass := g.Pass(context.Background(), "disk")
	if len(n.rt.Removed()) != 0 || len(pass.Removed) != 0 {
		t.Fatalf("dry run removed %v", n.rt.Removed())
	}
	if got := len(pub.keys("image", ActionSkipped)); got != 3 {
		t.Errorf("published %d skips, want one per planned image (3)", got)
	}
}

// TestImageGCDryRunLineIsTheRemovals: a dry run's would-remove line has
// the real removal's reason (space, not dry-run as on d7dd547) and says
// that its bytes are estimated: here the run removes 2 images, each
// freeing twice its size, where the dry run, which cannot measure, names 3.
func TestImageGCDryRunLineIsTheRemovals(t *testing.T) {
	var buf bytes.Buffer
	g, _, _, _ := newImageGC(t, newNode(), policy8070, func(o *imageGCConfig) { o.DryRun, o.Log = true, zerolog.New(&buf) })
	g.Pass(context.Background(), "disk")
	lines := 0
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["message"] != "would remove" {
			continue
		}
		lines++
		if m["reason"] != "space" || m["rule"] != "space" || !strings.Contains(fmt.Sprint(m["detail"]), "estimated by the image's size: a run measures the disk") {
			t.Errorf("would-remove line %v, want reason space and the estimate said", m)
		}
	}
	if lines != 3 {
		t.Errorf("%d would-remove lines, want 3:\n%s", lines, buf.String())
	}
	run, _, _, _ := newImageGC(t, newNode(), policy8070, nil)
	if p := run.Pass(context.Background(), "disk"); len(p.Removed) != 2 {
		t.Errorf("the run removed %d, want 2 (the disk measured after each)", len(p.Removed))
	}
}

func TestImageGCSubscribesAtConstruction(t *testing.T) {
	n := newNode()
	p := &fakeProjection{state: n.state}
	mustImageGC(t, ImageGCDeps{Projection: p, Runtime: n.rt, Disk: n.disk}, ImageGCOptions{Policy: policy8070, DryRun: true})
	if p.subs != 1 {
		t.Fatalf("subscribed %d times", p.subs)
	}
}

// kinds returns the kind.action of each published action, in order.
func (p *imagePublisher) kinds() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, a := range p.actions {
		out = append(out, a.Kind+"."+a.Action)
	}
	return out
}

func (p *imagePublisher) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.actions = nil
}

func TestImageGCRepeatedFruitlessPassPublishesNothing(t *testing.T) {
	n := newNode()
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		n.rt.Lease(digestOf(name), true) // every candidate is being pulled: nothing can go
	}
	var logs strings.Builder
	g, pub, clk, _ := newImageGC(t, n, policy8070, func(o *imageGCConfig) { o.Log = zerolog.New(&logs) })
	news := []string{"gc.started", "image.skipped", "image.skipped", "image.skipped", "gc.completed"}

	g.Pass(context.Background(), "disk")
	if got := pub.kinds(); !slices.Equal(got, news) {
		t.Fatalf("first fruitless pass published %v, want %v", got, news)
	}
	pub.reset()
	clk.Step(time.Second)
	logs.Reset()
	pass := g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) != 0 {
		t.Fatalf("a pass that repeats the last fruitless one published %v", got)
	}
	if len(pass.Skipped) != 3 || g.Status().LastPass.Trigger != "change" {
		t.Errorf("the quiet pass is not reported: %+v", pass)
	}
	if v := testutil.ToFloat64(g.m.skipped.WithLabelValues(string(ReasonInFlightPull))); v != 6 {
		t.Errorf("skips metric = %v, want both passes counted (6)", v)
	}
	if v := testutil.ToFloat64(g.m.passes.WithLabelValues("change", "completed")); v != 1 {
		t.Errorf("passes metric = %v", v)
	}
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(l, `"level":"debug"`) {
			t.Errorf("quiet pass logged above debug: %s", l)
		}
	}
	if !strings.Contains(logs.String(), `"message":"image skipped"`) || !strings.Contains(logs.String(), `"unchanged":true`) {
		t.Errorf("quiet pass not logged at debug:\n%s", logs.String())
	}

	// Asked for by an operator: always published.
	clk.Step(time.Second)
	g.Pass(context.Background(), "manual")
	if got := pub.kinds(); !slices.Equal(got, news) {
		t.Fatalf("manual pass published %v, want %v", got, news)
	}
	pub.reset()

	// Another outcome is news: a pull ended, a goes; everything in order.
	n.rt.Lease(digestOf("a"), false)
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	want := []string{"gc.started", "image.removed", "image.skipped", "image.skipped", "gc.completed"}
	if got := pub.kinds(); !slices.Equal(got, want) {
		t.Fatalf("pass that removed a published %v, want %v", got, want)
	}
	pub.reset()

	// After a pass that removed something, a fruitless one is news again.
	n.disk.Fill(50 * mib)
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) == 0 || got[0] != "gc.started" || got[len(got)-1] != "gc.completed" {
		t.Fatalf("fruitless pass after a fruitful one published %v", got)
	}
	pub.reset()

	// A different skip reason is news too.
	n.rt.InjectError("leases", "", errors.New("leases: unavailable"))
	clk.Step(time.Second)
	g.Pass(context.Background(), "change")
	if got := pub.kinds(); len(got) == 0 || got[len(got)-1] != "gc.failed" {
		t.Fatalf("pass with a new outcome published %v", got)
	}
}

func TestImageGCPolicy(t *testing.T) {
	n := newNode()
	n.state.Apply(sandbox(2*h, "sb1", "uid-1"))
	p := policy8070
	p.SandboxImages, p.KeepPatterns = []string{"cfg.test/pause:1"}, []string{"keep.test/*"}
	g, _, _, _ := newImageGC(t, n, p, func(o *imageGCConfig) {
		o.LearnSandboxImages = func(context.Context) ([]string, error) { return []string{"cri.test/pause:2"}, nil }
	})
	if got := g.Policy(); !slices.Equal(got.SandboxImages, []string{"cfg.test/pause:1"}) || got.HighThresholdPercent != 85 {
		t.Fatalf("policy before a pass: %+v", got)
	}
	done := make(chan struct{})
	go func() { // Policy is safe while a pass runs
		defer close(done)
		for range 100 {
			_ = g.Policy()
		}
	}()
	g.Pass(context.Background(), "disk")
	<-done
	got := g.Policy()
	if want := []string{"cfg.test/pause:1", "cri.test/pause:2", "pause:3.10"}; !slices.Equal(got.SandboxImages, want) {
		t.Errorf("sandbox images %v, want %v", got.SandboxImages, want)
	}
	if !slices.Equal(got.KeepPatterns, p.KeepPatterns) || got.MinAge != p.MinAge {
		t.Errorf("policy %+v", got)
	}
	got.SandboxImages[0] = "changed"
	if g.Policy().SandboxImages[0] != "cfg.test/pause:1" {
		t.Error("Policy shares its slice with the caller")
	}
}

// TestImageMetricsObservePass: the kept gauge is the last plan's keeps by
// reason (set, not added), and a triggered pass that ended above the low
// threshold counts as a shortfall.
func TestImageMetricsObservePass(t *testing.T) {
	m, err := newImageMetrics(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	plan := ImagePlan{Triggered: true, AmountToFree: 5 * mib, Keep: []ImageItem{{Reason: ReasonInUse}, {Reason: ReasonInUse}, {Reason: ReasonTooYoung}}}
	m.observePass("disk", "completed", plan, ImagePass{LowReached: false})
	m.observePass("disk", "completed", plan, ImagePass{LowReached: false})
	if v := testutil.ToFloat64(m.kept.WithLabelValues(string(ReasonInUse))); v != 2 {
		t.Errorf("kept in-use %v, want 2 (the last plan's, not a sum)", v)
	}
	if v := testutil.ToFloat64(m.kept.WithLabelValues(string(ReasonTooYoung))); v != 1 {
		t.Errorf("kept too-young %v", v)
	}
	if v := testutil.ToFloat64(m.short.WithLabelValues("disk")); v != 2 {
		t.Errorf("shortfalls %v", v)
	}
	if v := testutil.ToFloat64(m.target.WithLabelValues("disk")); v != 10*mib {
		t.Errorf("target %v", v)
	}
	m.observePass("max-age", "completed", ImagePlan{Keep: []ImageItem{{Reason: ReasonPinned}}}, ImagePass{})
	if v := testutil.ToFloat64(m.kept.WithLabelValues(string(ReasonInUse))); v != 0 {
		t.Errorf("a later plan keeps none in use, gauge %v", v)
	}
	if v := testutil.ToFloat64(m.short.WithLabelValues("max-age")); v != 0 {
		t.Errorf("an untriggered pass is no shortfall: %v", v)
	}
}
