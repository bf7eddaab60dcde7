package natsbus

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The fleet benchmark runs its parts as child processes of the test
// binary: three NATS servers (loadServerEnv + loadClusterEnv) and the
// simulated agents (fleetChildEnv), at most GCAGENT_FLEET_PER_PROCESS per
// process, because each agent holds two file descriptors (its connection
// and its bbolt outbox) and a process here may open at most 20,000.
const (
	loadClusterEnv = "GCAGENT_LOADBENCH_CLUSTER"
	fleetChildEnv  = "GCAGENT_LOADBENCH_FLEET"
)

// fleetChildConfig is what a fleet child runs: agents From..From+Count-1.
type fleetChildConfig struct {
	URLs        string
	Cluster     string
	From, Count int
	Dir         string
	Heartbeat   time.Duration
}

type fleetAgent struct {
	node string
	p    *Publisher
	nc   *nats.Conn
	sw   *StatusWriter
	m    *Metrics
}

// fleetReport is one JSON line a fleet child prints.
type fleetReport struct {
	Cmd          string  `json:"cmd"`
	Seconds      float64 `json:"seconds"`
	DoneUnixNano int64   `json:"doneUnixNano"`
	RSSKiB       int64   `json:"rssKiB"`
	HeapKiB      uint64  `json:"heapKiB"`
	CPUSeconds   float64 `json:"cpuS"`
	Published    int64   `json:"published"`
	Errors       int64   `json:"errors"`
	Depth        int     `json:"depth"`
	Dropped      float64 `json:"dropped"`
	Republished  float64 `json:"republished"`
	Duplicates   float64 `json:"duplicates"`
	StatusErrors int64   `json:"statusErrors"`
	Emptied      bool    `json:"emptied"` // drain: every outbox was empty at once (heartbeats may refill them after)
}

// waveAction is action i (0..9) of agent node's GC wave r: a pass that
// removes seven images and a container. Its subject names the wave.
func waveAction(node string, r, i int) Action {
	sub := fmt.Sprintf("w%d-%d", r, i)
	key := node + "/" + sub
	switch i {
	case 0:
		return Action{Kind: "gc", Action: "started", Subject: sub, Key: key, Data: map[string]any{"trigger": "disk", "usage": 87}}
	case 8:
		return Action{Kind: "container", Action: "removed", Subject: sub, Key: key, Data: map[string]any{"id": key, "reason": "per-unit-cap"}}
	case 9:
		return Action{Kind: "gc", Action: "completed", Subject: sub, Key: key, Data: map[string]any{"removed": 7, "freedBytes": 3 << 30}}
	}
	d := fmt.Sprintf("sha256:%064x", r*100+i)
	return Action{Kind: "image", Action: "removed", Subject: sub, Key: key, Data: map[string]any{"digest": d,
		"names": []string{fmt.Sprintf("registry.example/team/app-%d:v1.%d", i, r)}, "bytes": 412 << 20, "freedBytes": 380 << 20, "rule": "space"}}
}

// runFleetChild runs cfg's agents, each with its own connection, outbox
// and status writer, heartbeating every cfg.Heartbeat, and answers the
// commands on stdin (wave R S, quiet, drain S, stats) with one JSON line each.
func runFleetChild(cfgJSON string) int {
	var cfg fleetChildConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	var published, pubErrs, statusErrs atomic.Int64
	agents := make([]*fleetAgent, cfg.Count)
	var emptied atomic.Bool
	report := func(cmd string, start time.Time) {
		r := fleetReport{Cmd: cmd, Emptied: emptied.Load(), Seconds: time.Since(start).Seconds(), DoneUnixNano: time.Now().UnixNano(), RSSKiB: rssKiB(),
			HeapKiB: heapInuse() / 1024, CPUSeconds: selfCPU().Seconds(), Published: published.Load(), Errors: pubErrs.Load(),
			StatusErrors: statusErrs.Load()}
		for _, a := range agents {
			if a != nil {
				r.Depth += a.p.Depth()
				r.Dropped += testutil.ToFloat64(a.m.dropped)
				r.Republished += testutil.ToFloat64(a.m.republishes)
				r.Duplicates += testutil.ToFloat64(a.m.duplicates)
			}
		}
		outMu.Lock()
		_ = enc.Encode(r)
		outMu.Unlock()
	}
	publish := func(a *fleetAgent, act Action) {
		if err := a.p.Publish(act); err != nil {
			pubErrs.Add(1)
			return
		}
		published.Add(1)
	}
	start := time.Now()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range agents {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			node := fmt.Sprintf("node-%05d", cfg.From+i)
			nc, err := Connect(ConnOptions{URL: cfg.URLs, Cluster: cfg.Cluster, Node: node})
			if err != nil {
				panic(err)
			}
			m, _ := NewMetrics(nil)
			p, err := NewPublisher(nc, PublisherOptions{Cluster: cfg.Cluster, Node: node, StateDir: filepath.Join(cfg.Dir, node),
				NoCreateStream: true, Metrics: m})
			if err != nil {
				panic(err)
			}
			sw, err := NewStatusWriter(nc, StatusOptions{Cluster: cfg.Cluster, Node: node, NoCreateStream: true})
			if err != nil {
				panic(err)
			}
			agents[i] = &fleetAgent{node: node, p: p, nc: nc, sw: sw, m: m}
			publish(agents[i], Action{Kind: "agent", Action: "started", Subject: node, Key: node + "/start", Data: map[string]any{"version": "bench"}})
		}()
	}
	wg.Wait()
	drain := func(within time.Duration) {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			n := 0
			for _, a := range agents {
				n += a.p.Depth()
			}
			if n == 0 {
				emptied.Store(true)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	drain(5 * time.Minute)
	report("ready", start)

	// Heartbeats: an event and a status put per agent per interval, splayed.
	var quiet atomic.Bool
	var hbWG sync.WaitGroup
	for i, a := range agents {
		hbWG.Add(1)
		go func() {
			defer hbWG.Done()
			time.Sleep(rand.N(cfg.Heartbeat))
			disk := 40 + (cfg.From+i)%45
			if (cfg.From+i)%97 == 0 {
				disk = 91 // some nodes over the high threshold for watch to show
			}
			for seq := 0; !quiet.Load(); seq++ {
				hb := schema.Heartbeat{DiskUsagePercent: disk, Images: 40, Synced: true, ReclaimableBytes: 1 << 30,
					Outbox: a.p.Depth(), NATSMode: a.p.Mode()}
				publish(a, Action{Kind: "agent", Action: "heartbeat", Subject: a.node, Key: fmt.Sprintf("%s/hb/%d", a.node, seq), Data: hb})
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if a.sw.Put(ctx, schema.NodeStatus{Cluster: cfg.Cluster, Node: a.node, Version: "bench", At: time.Now().UTC(),
					HeartbeatIntervalSeconds: cfg.Heartbeat.Seconds(), ImageGCHighThreshold: 85, ImageGCLowThreshold: 80, Heartbeat: hb}) != nil {
					statusErrs.Add(1)
				}
				cancel()
				for t := time.Now(); time.Since(t) < cfg.Heartbeat && !quiet.Load(); {
					time.Sleep(min(time.Second, cfg.Heartbeat))
				}
			}
		}()
	}

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		t0 := time.Now()
		switch f[0] {
		case "wave": // wave R S: every agent publishes its 10 actions of wave R within S seconds
			r, _ := strconv.Atoi(f[1])
			spread, _ := time.ParseDuration(f[2])
			for i, a := range agents {
				wg.Add(1)
				go func() {
					defer wg.Done()
					phase := float64(i) / float64(len(agents))
					for k := range 10 {
						time.Sleep(time.Until(t0.Add(time.Duration((float64(k) + phase) / 10 * float64(spread)))))
						publish(a, waveAction(a.node, r, k))
					}
				}()
			}
			wg.Wait()
			report("wave", t0)
		case "quiet":
			quiet.Store(true)
			hbWG.Wait()
			report("quiet", t0)
		case "drain":
			within, _ := time.ParseDuration(f[1])
			emptied.Store(false)
			drain(within)
			report("drain", t0)
		case "stats":
			report("stats", t0)
		}
	}
	quiet.Store(true)
	for _, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); _ = a.p.Close(); a.nc.Close() }()
	}
	wg.Wait()
	return 0
}

// fleetChild is the parent's handle on a fleet child process.
type fleetChild struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	reports chan fleetReport
}

func (c *fleetChild) send(b *testing.B, line string) {
	if _, err := fmt.Fprintln(c.stdin, line); err != nil {
		b.Fatalf("fleet child: %v", err)
	}
}

func (c *fleetChild) wait(b *testing.B, cmd string, within time.Duration) fleetReport {
	select {
	case r, ok := <-c.reports:
		if !ok || r.Cmd != cmd {
			b.Fatalf("fleet child: want %s report, got %+v (ok %v)", cmd, r, ok)
		}
		return r
	case <-time.After(within):
		b.Fatalf("fleet child: no %s report within %s", cmd, within)
	}
	return fleetReport{}
}

func startFleetChild(b *testing.B, cfg fleetChildConfig) *fleetChild {
	js, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(js))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &fleetChild{cmd: cmd, stdin: stdin, reports: make(chan fleetReport, 16)}
	go func() {
		defer close(c.reports)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r fleetReport
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				c.reports <- r
			}
		}
	}()
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	return c
}

// procStat returns a process's CPU time and resident memory.
func procStat(pid int) (cpu time.Duration, rss int64) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // field 3 on
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		cpu = time.Duration(ut+st) * 10 * time.Millisecond // CLK_TCK 100
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				rss, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			}
		}
	}
	return cpu, rss
}

func freePortTB(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkFleetCluster: GCAGENT_FLEET_AGENTS (default 10,000) simulated
// agents, each with its own NATS connection, Publisher with its own bbolt
// outbox, and status writer, against three clustered nats-servers (child
// processes) with R3 event and status streams. Every agent heartbeats every
// GCAGENT_FLEET_HEARTBEAT (30s: an event and a status put); then a
// fleet-wide GC wave (10 actions per agent within GCAGENT_FLEET_WAVE, 60s);
// then `gcagent watch` (built from ./cmd/gcagent) is started against the
// fleet; then a second wave, during which the server leading the event
// stream is killed (SIGKILL). It reports events/s, publish-to-stored
// latency (the stream's store time minus the CloudEvent time), each
// server's CPU per event and RSS, the agents' RSS per agent, the time until
// every outbox is empty after the kill, watch's time to its full table and
// RSS, and fails on any event lost or stored twice (counted by id).
func BenchmarkFleetCluster(b *testing.B) {
	agents := envInt("GCAGENT_FLEET_AGENTS", 10_000)
	perProc := envInt("GCAGENT_FLEET_PER_PROCESS", 5_000)
	wave := envDuration("GCAGENT_FLEET_WAVE", time.Minute)
	hb := envDuration("GCAGENT_FLEET_HEARTBEAT", 30*time.Second)
	for range b.N {
		runFleetCluster(b, agents, perProc, wave, hb)
	}
}

type fleetServer struct {
	name, url string
	pid       int
	stop      func() time.Duration
	proc      *os.Process
	killed    bool
	profPort  int // its /debug/pprof (0: none)
}

func (s *fleetServer) stat() (time.Duration, int64) { return procStat(s.pid) }

// startFleetServers starts three clustered servers (child processes),
// each with its profiling port open when profiling, and returns them and
// their client URLs, comma-separated.
func startFleetServers(b *testing.B, profiling bool) ([]*fleetServer, string) {
	cports := []int{freePortTB(b), freePortTB(b), freePortTB(b)}
	var routes []string
	for _, p := range cports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	servers := make([]*fleetServer, 3)
	var urls []string
	for i := range servers {
		name := fmt.Sprintf("s%d", i)
		env := []string{fmt.Sprintf("%s=%s;%d;%s", loadClusterEnv, name, cports[i], strings.Join(routes, ","))}
		prof := 0
		if profiling {
			prof = freePortTB(b)
			env = append(env, fmt.Sprintf("%s=%d", loadProfPortEnv, prof))
		}
		url, stop, proc := startLoadServerCmd(b, env...)
		servers[i] = &fleetServer{name: name, url: url, pid: proc.Pid, stop: stop, proc: proc, profPort: prof}
		urls = append(urls, url)
	}
	return servers, strings.Join(urls, ",")
}

func runFleetCluster(b *testing.B, agents, perProc int, wave, hb time.Duration) {
	const cluster = "bench"
	servers, allURLs := startFleetServers(b, false)
	admin, err := nats.Connect(allURLs, nats.MaxReconnects(-1))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	js, _ := jetstream.New(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{EventPrefix + ".>"}, Replicas: 3,
			Duplicates: DefaultDuplicateWindow, MaxAge: DefaultStreamMaxAge, MaxBytes: 4 << 30, Storage: jetstream.FileStorage})
		if err == nil {
			_, err = js.CreateStream(cctx, StatusStreamConfig(DefaultStatusStream, 3, DefaultStatusMaxAge, DefaultStatusMaxBytes))
		}
		ccancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("R3 streams: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The stream as stored: every message by id, publish-to-stored latency per wave.
	var mu sync.Mutex
	seen := map[string]int{}
	lat := map[int][]time.Duration{}
	var waveStored [3]atomic.Int64
	var waveLast [3]atomic.Int64 // unix nano of the last stored event of the wave
	var stored atomic.Int64
	cons, err := js.OrderedConsumer(ctx, DefaultStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev CloudEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		md, _ := m.Metadata()
		stored.Add(1)
		mu.Lock()
		seen[ev.ID]++
		r := 0
		if len(ev.Subject) > 2 && ev.Subject[0] == 'w' && ev.Subject[2] == '-' {
			r = int(ev.Subject[1] - '0')
			lat[r] = append(lat[r], md.Timestamp.Sub(ev.Time))
		}
		mu.Unlock()
		if r == 1 || r == 2 {
			waveStored[r].Add(1)
			waveLast[r].Store(md.Timestamp.UnixNano())
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()

	// The fleet.
	t0 := time.Now()
	var children []*fleetChild
	for from := 0; from < agents; from += perProc {
		children = append(children, startFleetChild(b, fleetChildConfig{URLs: allURLs, Cluster: cluster, From: from,
			Count: min(perProc, agents-from), Dir: b.TempDir(), Heartbeat: hb}))
	}
	var agentRSS int64
	var agentHeap uint64
	for _, c := range children {
		r := c.wait(b, "ready", 15*time.Minute)
		agentRSS += r.RSSKiB
		agentHeap += r.HeapKiB
	}
	b.Logf("%d agents in %d processes connected, started and drained in %s", agents, len(children), time.Since(t0).Round(time.Millisecond))
	all := func(line, cmd string, within time.Duration) []fleetReport {
		for _, c := range children {
			c.send(b, line)
		}
		var out []fleetReport
		for _, c := range children {
			out = append(out, c.wait(b, cmd, within))
		}
		return out
	}
	waitStored := func(r int, within time.Duration) time.Time {
		deadline := time.Now().Add(within)
		for waveStored[r].Load() < int64(agents*10) {
			if time.Now().After(deadline) {
				b.Fatalf("wave %d: %d of %d events stored after %s", r, waveStored[r].Load(), agents*10, within)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Unix(0, waveLast[r].Load())
	}
	cpuOf := func() []time.Duration {
		out := make([]time.Duration, len(servers))
		for i, s := range servers {
			if !s.killed {
				out[i], _ = s.stat()
			}
		}
		return out
	}

	// Wave 1.
	b.ResetTimer()
	cpu0, stored0, w1 := cpuOf(), stored.Load(), time.Now()
	all(fmt.Sprintf("wave 1 %s", wave), "wave", wave+10*time.Minute)
	w1end := waitStored(1, 10*time.Minute)
	cpu1, stored1 := cpuOf(), stored.Load()
	w1dur := w1end.Sub(w1)
	winEvents := stored1 - stored0

	// gcagent watch against the fleet.
	bin := filepath.Join(b.TempDir(), "gcagent")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gcagent").CombinedOutput(); err != nil {
		b.Fatalf("build gcagent: %v\n%s", err, out)
	}
	watchCmd := exec.Command(bin, "watch", "--nats-url", allURLs, "--cluster", "*", "--refresh", "2s")
	watchOut, _ := watchCmd.StdoutPipe()
	watchCmd.Stderr = os.Stderr
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GCAGENT_") { // the benchmark's settings are no agent's
			watchCmd.Env = append(watchCmd.Env, kv)
		}
	}
	wStart := time.Now()
	if err := watchCmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = watchCmd.Process.Kill(); _ = watchCmd.Wait() }()
	var renders []time.Time
	var rendersMu sync.Mutex
	fullTable := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(watchOut)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		want := fmt.Sprintf("nodes: %d", agents)
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "gcagent fleet") {
				rendersMu.Lock()
				renders = append(renders, time.Now())
				rendersMu.Unlock()
			}
			if strings.HasPrefix(l, "... ") && strings.Contains(l, "more nodes") || strings.HasPrefix(l, "gcagent fleet") && strings.Contains(l, want) && agents <= 50 {
				select {
				case fullTable <- time.Now():
				default:
				}
			}
		}
		close(fullTable) // watch ended
	}()
	var watchReady time.Duration
	select {
	case at, ok := <-fullTable:
		if !ok {
			b.Fatal("gcagent watch ended before it showed the fleet")
		}
		watchReady = at.Sub(wStart)
	case <-time.After(2 * time.Minute):
		b.Fatalf("gcagent watch showed no full table of %d nodes within 2 minutes", agents)
	}
	_, watchRSS := procStat(watchCmd.Process.Pid)

	// Wave 2, with the server leading the event stream killed a third in.
	w2 := time.Now()
	for _, c := range children {
		c.send(b, fmt.Sprintf("wave 2 %s", wave))
	}
	for waveStored[2].Load() < int64(agents*10/3) && time.Since(w2) < wave+5*time.Minute {
		time.Sleep(50 * time.Millisecond)
	}
	info, err := js.Stream(ctx, DefaultStream)
	if err != nil {
		b.Fatal(err)
	}
	leader := info.CachedInfo().Cluster.Leader
	var victim *fleetServer
	for _, s := range servers {
		if s.name == leader {
			victim = s
		}
	}
	if victim == nil {
		b.Fatalf("stream leader %q is none of the servers", leader)
	}
	_, victimRSS := victim.stat()
	killAt := time.Now()
	_ = victim.proc.Signal(syscall.SIGKILL)
	victim.killed = true
	b.Logf("killed %s (stream leader) %s into wave 2, %d of its events stored", victim.name, killAt.Sub(w2).Round(time.Millisecond), waveStored[2].Load())
	for _, c := range children {
		c.wait(b, "wave", wave+10*time.Minute)
	}
	var emptyAt time.Time
	var drainAfterWave float64
	for _, r := range all("drain 10m", "drain", 11*time.Minute) {
		drainAfterWave = max(drainAfterWave, r.Seconds)
		if !r.Emptied {
			b.Errorf("outboxes still hold %d events 10 minutes after the kill", r.Depth)
		}
		if at := time.Unix(0, r.DoneUnixNano); at.After(emptyAt) {
			emptyAt = at
		}
	}
	w2end := waitStored(2, 10*time.Minute)

	// Quiet, then count: every event published is stored exactly once.
	all("quiet", "quiet", 5*time.Minute)
	var published, errs int64
	var dropped, republished, dupAcks float64
	var statusErrs int64
	for _, r := range all("drain 5m", "drain", 6*time.Minute) {
		published += r.Published
		errs += r.Errors
		dropped += r.Dropped
		republished += r.Republished
		dupAcks += r.Duplicates
		statusErrs += r.StatusErrors
	}
	deadline = time.Now().Add(5 * time.Minute)
	for stored.Load() < published && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // anything stored twice would show up now
	b.StopTimer()
	rendersMu.Lock()
	var maxGap time.Duration
	for i := 1; i < len(renders); i++ {
		if renders[i].After(w2) {
			maxGap = max(maxGap, renders[i].Sub(renders[i-1]))
		}
	}
	rendersMu.Unlock()
	_, watchRSS2 := procStat(watchCmd.Process.Pid)

	mu.Lock()
	dups, distinct := 0, int64(len(seen))
	for _, n := range seen {
		if n > 1 {
			dups++
		}
	}
	p := func(r int, q float64) float64 {
		d := lat[r]
		slices.Sort(d)
		if len(d) == 0 {
			return 0
		}
		return float64(d[min(len(d)-1, int(float64(len(d))*q))].Microseconds()) / 1000
	}
	w1p50, w1p99, w2p50, w2p99 := p(1, 0.5), p(1, 0.99), p(2, 0.5), p(2, 0.99)
	mu.Unlock()
	if distinct != published || dups > 0 || errs > 0 || dropped > 0 {
		b.Errorf("published %d events (%d refused, %v dropped from outboxes): stored %d distinct, %d stored more than once",
			published, errs, dropped, distinct, dups)
	}

	fmt.Printf("\nfleet: %d agents (%d processes), 3 servers, R3 streams, heartbeat %s, waves of 10 actions per agent within %s\n",
		agents, len(children), hb, wave)
	fmt.Printf("wave 1: %d events stored in %.1f s: %.0f events/s; publish-to-stored p50 %.1f ms, p99 %.1f ms\n",
		agents*10, w1dur.Seconds(), float64(agents*10)/w1dur.Seconds(), w1p50, w1p99)
	for i, s := range servers {
		_, rss := s.stat()
		if s.killed {
			rss = victimRSS
		}
		fmt.Printf("  server %s: %.0f µs CPU per stored event (%d events in the wave's window, heartbeats included), RSS %d MiB%s\n",
			s.name, float64((cpu1[i]-cpu0[i]).Microseconds())/float64(winEvents), winEvents, rss/1024,
			map[bool]string{true: " (before it was killed)"}[s.killed])
	}
	fmt.Printf("agents: %.0f KiB RSS per agent (%d MiB in %d processes), Go heap %.0f KiB per agent\n",
		float64(agentRSS)/float64(agents), agentRSS/1024, len(children), float64(agentHeap)/float64(agents))
	fmt.Printf("watch: full table of %d nodes %.2f s after start, RSS %d MiB then, %d MiB after wave 2; longest gap between redraws during wave 2: %.1f s (refresh 2 s)\n",
		agents, watchReady.Seconds(), watchRSS/1024, watchRSS2/1024, maxGap.Seconds())
	fmt.Printf("wave 2: server %s killed %.1f s in; every outbox empty %.1f s after the kill (%.1f s after the wave's last publish); wave stored in %.1f s; p50 %.1f ms, p99 %.1f ms\n",
		victim.name, killAt.Sub(w2).Seconds(), emptyAt.Sub(killAt).Seconds(), drainAfterWave, w2end.Sub(w2).Seconds(), w2p50, w2p99)
	fmt.Printf("exactly once: %d events published, %d distinct ids stored, %d stored twice, %d refused, %.0f dropped; %.0f resent, %.0f acked as duplicates; %d status puts failed\n",
		published, distinct, dups, errs, dropped, republished, dupAcks, statusErrs)
	b.ReportMetric(float64(agents), "agents")
	b.ReportMetric(float64(agents*10)/w1dur.Seconds(), "wave-events/s")
	b.ReportMetric(w1p99, "wave-p99-ms")
	b.ReportMetric(watchReady.Seconds(), "watch-s")
	b.ReportMetric(emptyAt.Sub(killAt).Seconds(), "drained-after-kill-s")
	b.ReportMetric(float64(dups), "duplicates")
	b.ReportMetric(float64(published-distinct), "lost")
}
