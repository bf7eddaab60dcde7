package natsbus

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// loadServerEnv makes the test binary a NATS server for the load benchmark,
// so that the benchmark's own CPU and memory are the publishers' alone.
const loadServerEnv = "GCAGENT_LOADBENCH_SERVER_STORE"

// loadProfPortEnv opens the load server's profiling port (/debug/pprof).
const loadProfPortEnv = "GCAGENT_LOADBENCH_PROFPORT"

func TestMain(m *testing.M) {
	if store := os.Getenv(loadServerEnv); store != "" {
		os.Exit(runLoadServer(store))
	}
	if cfg := os.Getenv(fleetChildEnv); cfg != "" {
		os.Exit(runFleetChild(cfg))
	}
	if cfg := os.Getenv(keepFleetChildEnv); cfg != "" {
		os.Exit(runKeepFleetChild(cfg))
	}
	os.Exit(m.Run())
}

// runLoadServer runs a JetStream server on a free loopback port, prints its
// URL, and stops when stdin closes. With loadClusterEnv set
// ("<name>;<cluster port>;<routes>") it is one server of a routed cluster.
func runLoadServer(store string) int {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: store,
		NoLog: true, NoSigs: true, MaxPayload: 1 << 20}
	if c := strings.Split(os.Getenv(loadClusterEnv), ";"); len(c) == 3 {
		port, _ := strconv.Atoi(c[1])
		opts.ServerName = c[0]
		opts.Cluster = server.ClusterOpts{Name: "gcagent-bench", Host: "127.0.0.1", Port: port}
		opts.Routes = server.RoutesFromStr(c[2])
	}
	if p, err := strconv.Atoi(os.Getenv(loadProfPortEnv)); err == nil && p > 0 {
		opts.ProfPort = p
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "not ready")
		return 1
	}
	fmt.Println(s.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// startLoadServer starts the server child process; stop ends it and returns its CPU time.
func startLoadServer(b *testing.B, env ...string) (url string, stop func() time.Duration) {
	url, stop, _ = startLoadServerCmd(b, env...)
	return url, stop
}

// startLoadServerCmd is startLoadServer that also returns the process.
func startLoadServerCmd(b *testing.B, env ...string) (url string, stop func() time.Duration, proc *os.Process) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), loadServerEnv+"="+b.TempDir()), env...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		b.Fatalf("load server: %v", err)
	}
	var once sync.Once
	var cpu time.Duration
	stop = func() time.Duration {
		once.Do(func() {
			stdin.Close()
			_ = cmd.Wait()
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
		})
		return cpu
	}
	b.Cleanup(func() { stop() })
	return strings.TrimSpace(line), stop, cmd.Process
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func rssKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// loadMix is one agent's burst: a start, a GC pass that removes images and
// containers and a log, a skip, heartbeats.
func loadMix(node string, round int) []Action {
	data := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	k := func(s string) string { return fmt.Sprintf("%s/%d/%s", node, round, s) }
	acts := []Action{
		{Kind: "agent", Action: "started", Subject: node, Key: k("start"), Data: data("version", "bench", "namespace", "k8s.io")},
		{Kind: "gc", Action: "started", Subject: "image", Key: k("gc"), Data: data("trigger", "disk", "usage", 87, "amountToFree", 3<<30)},
	}
	for i := range 8 {
		d := fmt.Sprintf("sha256:%064x", i+round*100)
		acts = append(acts, Action{Kind: "image", Action: "removed", Subject: d, Key: k(d),
			Data: data("digest", d, "names", []string{fmt.Sprintf("registry.example/team/app-%d:v1.%d", i, round)}, "bytes", 412<<20, "freedBytes", 380<<20, "rule", "space", "reason", "space")})
	}
	acts = append(acts, Action{Kind: "image", Action: "skipped", Subject: "sha256:in-use", Key: k("skip"), Data: data("reason", "in-use")})
	for i := range 4 {
		id := fmt.Sprintf("%064x", i+7+round*1000)
		acts = append(acts, Action{Kind: "container", Action: "removed", Subject: id, Key: k(id), Data: data("id", id, "kind", "native", "reason", "per-unit-cap")})
	}
	acts = append(acts, Action{Kind: "log", Action: "removed", Subject: "/var/log/containers/x.log", Key: k("log"), Data: data("kind", "symlink", "reason", "container-exited")},
		Action{Kind: "gc", Action: "completed", Subject: "image", Key: k("gc"), Data: data("removed", 8, "freedBytes", 3<<30)})
	for i := range 3 {
		acts = append(acts, Action{Kind: "agent", Action: "heartbeat", Subject: node, Key: k(fmt.Sprint("hb", i)), Data: data("diskUsagePercent", 79, "images", 40, "outbox", 0)})
	}
	return acts
}

// BenchmarkFleetLoad: GCAGENT_TEST_LOAD_AGENTS (default 500) simulated agents,
// each with its own NATS connection, Publisher and bbolt outbox on its own
// state dir, publish into one JetStream server (a child process) read by a
// watch-style ordered consumer. Phase burst: every agent publishes its mix
// (20 events) at once: events/s end to end. Phase steady: every agent
// publishes one event per second for 10 s: end-to-end latency (CloudEvent
// time at Publish to the consumer's receipt), which includes the outbox's
// fsync. Reported per agent: CPU (getrusage of this process, which holds
// only the publishers and the consumer) and memory (Go heap and RSS growth
// from creating the agents, divided by their number). All outboxes share
// this machine's one disk, which real nodes do not: a pessimistic setup.
func BenchmarkFleetLoad(b *testing.B) {
	agents := 500
	if v, err := strconv.Atoi(os.Getenv("GCAGENT_TEST_LOAD_AGENTS")); err == nil && v > 0 {
		agents = v
	}
	const steadySeconds = 10
	for range b.N {
		runFleetLoad(b, agents, steadySeconds)
	}
}

func runFleetLoad(b *testing.B, agents, steadySeconds int) {
	url, stopServer := startLoadServer(b)
	admin, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	js, _ := jetstream.New(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{EventPrefix + ".>"},
		Duplicates: DefaultDuplicateWindow, MaxAge: DefaultStreamMaxAge, MaxBytes: DefaultStreamMaxBytes, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}

	// The watch-style consumer.
	var mu sync.Mutex
	seen := map[string]int{}
	var lat []time.Duration
	var received atomic.Int64
	cons, err := js.OrderedConsumer(ctx, DefaultStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{EventPrefix + ".>"}})
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		var ev CloudEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		mu.Lock()
		seen[ev.ID]++
		lat = append(lat, now.Sub(ev.Time))
		mu.Unlock()
		received.Add(1)
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()

	heap0, rss0 := heapInuse(), rssKiB()
	conns := make([]*nats.Conn, agents)
	pubs := make([]*Publisher, agents)
	for i := range agents {
		node := fmt.Sprintf("node-%04d", i)
		nc, err := Connect(ConnOptions{URL: url, Cluster: "load", Node: node})
		if err != nil {
			b.Fatal(err)
		}
		p, err := NewPublisher(nc, PublisherOptions{Cluster: "load", Node: node, StateDir: b.TempDir(), NoCreateStream: true})
		if err != nil {
			b.Fatal(err)
		}
		conns[i], pubs[i] = nc, p
	}
	defer func() {
		for i := range pubs {
			_ = pubs[i].Close()
			conns[i].Close()
		}
	}()
	waitAll := func(want int64, within time.Duration) {
		deadline := time.Now().Add(within)
		for received.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("consumer has %d of %d events after %s", received.Load(), want, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Let every publisher find the stream: one event each.
	for i, p := range pubs {
		if err := p.Publish(Action{Kind: "agent", Action: "started", Subject: "warmup", Key: fmt.Sprint("warmup-", i)}); err != nil {
			b.Fatal(err)
		}
	}
	waitAll(int64(agents), time.Minute)
	heap1, rss1 := heapInuse(), rssKiB()
	mu.Lock()
	lat = lat[:0]
	mu.Unlock()

	// Burst.
	b.ResetTimer()
	mix := len(loadMix("x", 0))
	cpu0, start := selfCPU(), time.Now()
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, a := range loadMix(fmt.Sprintf("node-%04d", i), 1) {
				if err := p.Publish(a); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	burstTotal := int64(agents + agents*mix)
	waitAll(burstTotal, time.Minute)
	burstDur, burstCPU := time.Since(start), selfCPU()-cpu0
	mu.Lock()
	burstLat := slices.Clone(lat)
	lat = lat[:0]
	mu.Unlock()

	// Steady: one event per agent per second, phases spread over the second.
	cpu1, start := selfCPU(), time.Now()
	for i, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Second / time.Duration(agents))
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for s := range steadySeconds {
				a := loadMix(fmt.Sprintf("node-%04d", i), 2+s)[2+s%8]
				if err := p.Publish(a); err != nil {
					b.Error(err)
					return
				}
				<-t.C
			}
		}()
	}
	wg.Wait()
	total := burstTotal + int64(agents*steadySeconds)
	waitAll(total, time.Minute)
	steadyDur, steadyCPU := time.Since(start), selfCPU()-cpu1
	b.StopTimer()
	serverCPU := stopServer()

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, n := range seen {
		if n > 1 {
			dups++
		}
	}
	if int64(len(seen)) != total || dups > 0 {
		b.Errorf("consumer saw %d distinct events of %d, %d more than once", len(seen), total, dups)
	}
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		if len(d) == 0 {
			return 0
		}
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(agents), "agents")
	b.ReportMetric(float64(agents*mix)/burstDur.Seconds(), "burst-events/s")
	b.ReportMetric(pct(burstLat, 0.99), "burst-p99-ms")
	b.ReportMetric(pct(lat, 0.50), "steady-p50-ms")
	b.ReportMetric(pct(lat, 0.99), "steady-p99-ms")
	b.ReportMetric(float64(burstCPU.Microseconds())/1000/float64(agents), "burst-cpu-ms/agent")
	b.ReportMetric(float64(steadyCPU.Microseconds())/1000/float64(agents)/float64(steadySeconds), "steady-cpu-ms/agent/s")
	b.ReportMetric(float64(heap1-heap0)/1024/float64(agents), "heap-KiB/agent")
	b.ReportMetric(float64(rss1-rss0)/float64(agents), "rss-KiB/agent")
	b.ReportMetric(serverCPU.Seconds(), "server-cpu-s")
	b.Logf("agents %d: burst %d events in %s (%s CPU here), steady %d events in %s (%s CPU here), server CPU %s",
		agents, agents*mix, burstDur.Round(time.Millisecond), burstCPU.Round(time.Millisecond),
		agents*steadySeconds, steadyDur.Round(time.Millisecond), steadyCPU.Round(time.Millisecond), serverCPU.Round(time.Millisecond))
}
