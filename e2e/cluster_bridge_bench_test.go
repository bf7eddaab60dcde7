package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/nodeevents"
	"github.com/gcagent/gcagent/schema"
)

// BenchmarkClusterEventsBridge: a real API server with
// GCAGENT_BENCH_BRIDGE_NODES (100) Node objects, the chart's RBAC, a NATS
// server with the agents' event stream, and gcagent-cluster bridging it
// to Events. GCAGENT_BENCH_BRIDGE_RATE (200) agent actions per second are
// published into GCAGENT_EVT for GCAGENT_BENCH_BRIDGE_SECONDS (60), as the
// nodes' GC passes would send them (each pass on one node, the nodes in
// turn: seven image.removed, two container.removed, one gc.completed).
// Every second it samples the component's durable consumer (pending and
// unacknowledged; the age of the oldest action not yet acknowledged, from
// each action's publish ack) and the component's metrics (its
// events_pending and events_lag_seconds gauges, its Event writes), its CPU
// and RSS. It reports the consumer's backlog (max, at the end of the
// load, and how long after it every action was acknowledged), the lag, the
// Events written by verb and the component's CPU and memory.
func BenchmarkClusterEventsBridge(b *testing.B) {
	nodes := benchEnvInt("GCAGENT_BENCH_BRIDGE_NODES", 100)
	rate := benchEnvInt("GCAGENT_BENCH_BRIDGE_RATE", 200)
	seconds := benchEnvInt("GCAGENT_BENCH_BRIDGE_SECONDS", 60)
	for range b.N {
		runClusterEventsBridge(b, nodes, rate, seconds)
	}
}

// eventBurst is gcagent-cluster's --event-burst default: the Events a
// node may get per reason before client-go's spam filter holds them back
// (one more per --event-refill, 5m).
const eventBurst = 25

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// bridgeSample is one second's reading.
type bridgeSample struct {
	at         time.Time
	pending    uint64        // the consumer's pending plus unacknowledged
	oldest     time.Duration // age of the oldest action not acknowledged (0: none)
	gaugeLag   float64       // gcagent_cluster_events_lag_seconds
	gaugePend  float64       // gcagent_cluster_events_pending
	cpu        time.Duration // the component's CPU so far
	rss        int64
	published  uint64 // the last stream sequence published so far
	ackFloor   uint64
	writes     float64 // Event writes so far, every verb
	writeFails float64
}

func runClusterEventsBridge(b *testing.B, nodes, rate, seconds int) {
	const cluster = "bench"
	api := testenv.StartAPIServer(b, testenv.APIServerOptions{Users: []testenv.APIUser{testenv.ClusterUser()}})
	testenv.ApplyClusterRBAC(b, api)
	admin := kubernetes.NewForConfigOrDie(api.Config(testenv.AdminUser))
	srv := testenv.StartNATS(b, testenv.NATSOptions{JetStream: true})
	ctx := context.Background()
	names := make([]string, nodes)
	parallel(b, nodes, func(i int) error {
		names[i] = fmt.Sprintf("node-%03d", i)
		_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}, metav1.CreateOptions{})
		return err
	})
	nc := mustNATS(b, srv.ClientURL())
	js, _ := jetstream.New(nc)
	// The stream as the agents make it (natsbus.Publisher's defaults).
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsbus.DefaultStream, Subjects: []string{natsbus.EventPrefix + ".>"},
		Storage: jetstream.FileStorage, MaxAge: natsbus.DefaultStreamMaxAge, MaxBytes: natsbus.DefaultStreamMaxBytes,
		Duplicates: natsbus.DefaultDuplicateWindow}); err != nil {
		b.Fatal(err)
	}
	c := testenv.StartCluster(b, api, "bench", "--nats-url", srv.ClientURL(), "--cluster", cluster, "--leader-election=false",
		"--log-format", "json")
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(c.LogTail(50), "bridging the agents' actions") {
		if time.Now().After(deadline) {
			b.Fatalf("bridge not started:\n%s", c.LogTail(10))
		}
		time.Sleep(100 * time.Millisecond)
	}
	cons, err := js.Consumer(ctx, natsbus.DefaultStream, "gcagent-cluster-"+cluster)
	if err != nil {
		b.Fatal(err)
	}

	// Publish times by stream sequence.
	var mu sync.Mutex
	pubAt := map[uint64]time.Time{}
	var lastSeq uint64
	publish := func(node, kind, action, key string, data any) {
		ev, err := natsbus.NewEvent(cluster, node, natsbus.Action{Kind: kind, Action: action, Key: key, Subject: key, Data: data}, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		body, _ := json.Marshal(ev)
		ack, err := js.Publish(ctx, natsbus.Subject(cluster, node, kind, action), body, jetstream.WithMsgID(ev.ID))
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		pubAt[ack.Sequence] = time.Now()
		lastSeq = max(lastSeq, ack.Sequence)
		mu.Unlock()
	}
	// pass p: ten actions of node p%nodes.
	pass := func(p int) {
		node := names[p%nodes]
		now := time.Now().UTC()
		for i := range 7 {
			d := fmt.Sprintf("sha256:%064x", p*10+i)
			publish(node, "image", "removed", d, map[string]any{"namespace": "k8s.io", "digest": d,
				"names": []string{fmt.Sprintf("registry.example.com/team/app-%d:v1.%d", i, p)}, "bytes": 412 << 20, "freedBytes": 380 << 20,
				"rule": "space", "action": "removed", "reason": "space"})
		}
		for i := range 2 {
			id := fmt.Sprintf("%064x", p*10+7+i)
			publish(node, "container", "removed", id, schema.ContainerRemoval{Namespace: "k8s.io", ID: id, Kind: "container",
				PodName: fmt.Sprintf("job-%d", p), PodNamespace: "batch", ContainerName: "main", Reason: "per-unit-cap", Rule: "per-unit-cap", At: now})
		}
		publish(node, "gc", "completed", fmt.Sprintf("pass-%d", p), schema.GCPass{Start: now.Add(-2 * time.Second), End: now, Trigger: "disk",
			Usage: 87, AmountToFree: 3 << 30, Planned: 7, Removed: 7, EstimatedBytes: 7 * 412 << 20, FreedBytes: 7 * 380 << 20, UsageAfter: 79})
	}

	sample := func() bridgeSample {
		s := bridgeSample{at: time.Now()}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(cctx)
		cancel()
		mu.Lock()
		s.published = lastSeq
		if err == nil {
			s.pending = info.NumPending + uint64(info.NumAckPending)
			s.ackFloor = info.AckFloor.Stream
			if s.ackFloor < lastSeq {
				// The oldest action not acknowledged is the first after the floor.
				for q := s.ackFloor + 1; q <= lastSeq; q++ {
					if t, ok := pubAt[q]; ok {
						s.oldest = s.at.Sub(t)
						break
					}
				}
			}
		}
		mu.Unlock()
		m := c.Metrics()
		s.gaugeLag = metricSum(m, "gcagent_cluster_events_lag_seconds")
		s.gaugePend = metricSum(m, "gcagent_cluster_events_pending")
		s.writes = metricSum(m, "gcagent_cluster_event_writes_total")
		s.writeFails = metricSum(m, "gcagent_cluster_event_write_failures_total")
		s.cpu, _ = testenv.ReadProcCPU(c.Pid())
		if pm, err := testenv.ReadProcMemory(c.Pid()); err == nil {
			s.rss = pm.RSS
		}
		return s
	}

	// The load: passes (10 actions) at rate/10 per second, evenly paced.
	b.ResetTimer()
	before := sample()
	var samples []bridgeSample
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	var smu sync.Mutex
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s := sample()
				smu.Lock()
				samples = append(samples, s)
				smu.Unlock()
			}
		}
	}()
	start := time.Now()
	passes := rate * seconds / 10
	every := time.Second * 10 / time.Duration(rate)
	behind := time.Duration(0)
	for p := range passes {
		if d := time.Until(start.Add(time.Duration(p) * every)); d > 0 {
			time.Sleep(d)
		} else {
			behind = max(behind, -d)
		}
		pass(p)
	}
	loadEnd := time.Now()
	atEnd := sample()
	// Then until every action is acknowledged.
	var drained time.Duration
	for {
		s := sample()
		if s.ackFloor >= s.published && s.pending == 0 {
			drained = time.Since(loadEnd)
			break
		}
		if time.Since(loadEnd) > 5*time.Minute {
			b.Fatalf("5 minutes after the load, the consumer still has %d actions pending (ack floor %d of %d)", s.pending, s.ackFloor, s.published)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The recorder writes what it queued after the last action is
	// acknowledged: until its writes stop for 5 s (at most 3 minutes).
	for last, since := sample().writes, time.Now(); time.Since(since) < 5*time.Second; {
		if time.Since(loadEnd) > 3*time.Minute {
			b.Fatalf("the component still writes Events 3 minutes after the load")
		}
		time.Sleep(time.Second)
		if w := sample().writes; w != last {
			last, since = w, time.Now()
		}
	}
	settled := time.Since(loadEnd)
	close(stop)
	sampled.Wait()
	final := sample()
	b.StopTimer()

	smu.Lock()
	defer smu.Unlock()
	var maxPending uint64
	var oldest, lags []float64
	var maxGaugePend float64
	var peakRSS int64
	for _, s := range samples {
		if s.at.After(loadEnd) {
			continue
		}
		maxPending = max(maxPending, s.pending)
		maxGaugePend = max(maxGaugePend, s.gaugePend)
		oldest = append(oldest, s.oldest.Seconds())
		lags = append(lags, s.gaugeLag)
		peakRSS = max(peakRSS, s.rss)
	}
	slices.Sort(oldest)
	slices.Sort(lags)
	q := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return xs[min(len(xs)-1, int(float64(len(xs))*p))]
	}
	// The pending over time, one figure per tenth of the run.
	var curve []string
	for i := 0; i < len(samples); i += max(1, len(samples)/10) {
		curve = append(curve, fmt.Sprintf("%.0fs:%d", samples[i].at.Sub(start).Seconds(), samples[i].pending))
	}
	m := c.Metrics()
	recorded := metricSum(m, "gcagent_cluster_events_recorded_total")
	skipped := metricSum(m, "gcagent_cluster_events_skipped_total")
	verbs := map[string]float64{}
	for _, v := range []string{"create", "patch", "update"} {
		verbs[v] = metricSum(m, fmt.Sprintf(`gcagent_cluster_event_writes_total{verb="%s"}`, v))
	}
	evs, err := admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// Occurrences on the API server by reason, against what the actions
	// ask for and what the recorder's spam filter lets through (its burst
	// per node and reason, the run being shorter than one refill).
	var series int32
	occurred := map[string]int{}
	for _, e := range evs.Items {
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		series += int32(n)
		occurred[e.Reason] += n
	}
	perNode := map[string]int{nodeevents.ReasonImageRemoved: 7, nodeevents.ReasonContainerRemoved: 2, nodeevents.ReasonImageGCCompleted: 1}
	var reasons []string
	var allowedSum int
	for _, r := range []string{nodeevents.ReasonImageRemoved, nodeevents.ReasonContainerRemoved, nodeevents.ReasonImageGCCompleted} {
		asked, allowed := 0, 0
		for i := range nodes {
			n := perNode[r] * (passes/nodes + b2i(i < passes%nodes))
			asked += n
			allowed += min(n, eventBurst)
		}
		allowedSum += allowed
		reasons = append(reasons, fmt.Sprintf("%s %d asked, %d let through by the spam filter, %d on the API server", r, asked, allowed, occurred[r]))
	}
	var peakWrites float64
	for i := 1; i < len(samples); i++ {
		peakWrites = max(peakWrites, (samples[i].writes-samples[i-1].writes)/samples[i].at.Sub(samples[i-1].at).Seconds())
	}
	// What client-go's recorder dropped because its queue (1,000) was full:
	// one warn line each.
	logText, _ := os.ReadFile(c.LogFile)
	queueDrops := strings.Count(string(logText), "too many queued events")
	loadS := loadEnd.Sub(start).Seconds()
	cores := (atEnd.cpu - before.cpu).Seconds() / atEnd.at.Sub(before.at).Seconds()
	published := atEnd.published
	fmt.Printf("\nevents bridge: %d nodes, %d actions/s for %d s (%d actions published in %.1f s; the publisher fell %.0f ms behind its pace at most)\n",
		nodes, rate, seconds, published, loadS, float64(behind.Milliseconds()))
	fmt.Printf("consumer backlog (pending + unacknowledged): max %d, at the end of the load %d, every action acknowledged %.2f s after it; over time %s\n",
		maxPending, atEnd.pending, drained.Seconds(), strings.Join(curve, " "))
	fmt.Printf("age of the oldest unacknowledged action, per second: p50 %.2f s, p99 %.2f s, max %.2f s; the component's events_lag_seconds p50 %.3f s, max %.3f s; its events_pending at most %.0f\n",
		q(oldest, 0.5), q(oldest, 0.99), q(oldest, 1), q(lags, 0.5), q(lags, 1), maxGaugePend)
	fmt.Printf("recorded %.0f actions (%.0f skipped); Event writes: %.0f creates, %.0f patches, %.0f updates, %.0f failed; the API server holds %d Events standing for %d occurrences\n",
		recorded, skipped, verbs["create"], verbs["patch"], verbs["update"], final.writeFails, len(evs.Items), series)
	fmt.Printf("by reason: %s\n", strings.Join(reasons, "; "))
	fmt.Printf("Event writes: %.1f per second during the load, at most %.0f in one second; the last %.1f s after the load; %d the spam filter lets through were never written\n",
		(atEnd.writes-before.writes)/loadS, peakWrites, (settled - 5*time.Second).Seconds(), allowedSum-int(series))
	fmt.Printf("recorder: %d actions dropped at its incoming queue (each logged); the component's log %d KiB\n", queueDrops, len(logText)>>10)
	fmt.Printf("gcagent-cluster: %.3f cores during the load (%.2f ms CPU per action), RSS %.1f MiB before, peak %.1f MiB, %.1f MiB at the end\n",
		cores, (atEnd.cpu-before.cpu).Seconds()*1000/float64(published), float64(before.rss)/(1<<20), float64(peakRSS)/(1<<20), float64(final.rss)/(1<<20))
	b.ReportMetric(float64(published)/loadS, "actions/s")
	b.ReportMetric(float64(maxPending), "pending-max")
	b.ReportMetric(float64(atEnd.pending), "pending-end")
	b.ReportMetric(drained.Seconds(), "drained-s")
	b.ReportMetric(q(oldest, 0.99), "oldest-unacked-p99-s")
	b.ReportMetric(q(lags, 1), "lag-gauge-max-s")
	b.ReportMetric(verbs["create"], "event-creates")
	b.ReportMetric(verbs["patch"], "event-patches")
	b.ReportMetric(float64(queueDrops), "recorder-dropped")
	b.ReportMetric(float64(allowedSum-int(series)), "unwritten")
	b.ReportMetric(cores, "cpu-cores")
	b.ReportMetric(float64(peakRSS)/(1<<20), "rss-peak-MiB")
}
