package natsbus

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// keepFleetChildEnv makes the test binary a process of simulated agents
// that watch the fleet keep list (keepChildConfig, as JSON).
const keepFleetChildEnv = "GCAGENT_LOADBENCH_KEEPFLEET"

// keepChildConfig is what a keep fleet child runs: agents From..From+Count-1,
// at most Parallel of them between their connect and their first sync.
type keepChildConfig struct {
	URLs        string
	Cluster     string
	From, Count int
	Parallel    int
}

// keepReport is one JSON line a keep fleet child prints.
type keepReport struct {
	Cmd      string `json:"cmd"`
	Synced   int    `json:"synced"`   // agents whose watch delivered its current values at least once
	Watching int    `json:"watching"` // agents whose watch is synced now
	// SyncSeconds is each agent's first sync: from its connect to its
	// watch's Synced (ready only).
	SyncSeconds []float64 `json:"syncS,omitempty"`
	// Arrivals (collect): per agent, when its callback got the key at the
	// revision asked or later (unix ns; 0: not by the deadline).
	Arrivals   []int64        `json:"arrivals,omitempty"`
	Restarts   int64          `json:"restarts"` // watches that ended and were made again
	Causes     map[string]int `json:"causes,omitempty"`
	RSSKiB     int64          `json:"rssKiB"`
	CPUSeconds float64        `json:"cpuS"`
}

// keepAgent is one simulated agent's watch and what it received.
type keepAgent struct {
	mu  sync.Mutex
	got map[string]keepGot // by key: the highest revision received, and when it first came
	// watching is set by a watch's Synced and cleared when it ends.
	watching atomic.Bool
}

type keepGot struct {
	rev uint64
	at  int64
}

func (a *keepAgent) record(key string, rev uint64, at int64) {
	a.mu.Lock()
	if g := a.got[key]; rev > g.rev {
		a.got[key] = keepGot{rev: rev, at: at}
	}
	a.mu.Unlock()
}

// arrival is when the agent got key at revision rev or later (0: not yet).
func (a *keepAgent) arrival(key string, rev uint64) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if g := a.got[key]; g.rev >= rev {
		return g.at
	}
	return 0
}

// runKeepFleetChild runs cfg's agents, each with its own connection and
// the watch the agent runs (natsbus.WatchKeep of all, clusters.<cluster>
// and declared.<cluster>.>, made again at the agent's backoff when it
// ends), and answers the commands on stdin (stats, collect KEY REV
// DEADLINE_UNIX_NS) with one JSON line each. The callback records what
// came and when; it does not decode the cluster list's values (the agent
// does, on its own node's CPU: that cost is no fleet's).
func runKeepFleetChild(cfgJSON string) int {
	var cfg keepChildConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	keys := []string{KeepAllKey, KeepClusterKey(cfg.Cluster), declared.WatchKeys(cfg.Cluster)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agents := make([]*keepAgent, cfg.Count)
	syncS := make([]float64, cfg.Count)
	var synced, restarts atomic.Int64
	var causeMu sync.Mutex
	causes := map[string]int{}
	sem := make(chan struct{}, max(cfg.Parallel, 1))
	var wg sync.WaitGroup
	for i := range agents {
		a := &keepAgent{got: map[string]keepGot{}}
		agents[i] = a
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			released := false
			release := func() {
				if !released {
					released = true
					<-sem
				}
			}
			defer release()
			node := fmt.Sprintf("node-%05d", cfg.From+i)
			t0 := time.Now()
			nc, err := Connect(ConnOptions{URL: cfg.URLs, Cluster: cfg.Cluster, Node: node})
			if err != nil {
				panic(err)
			}
			defer nc.Close()
			js, err := NewJetStream(nc, "")
			if err != nil {
				panic(err)
			}
			backoff := time.Second
			for ctx.Err() == nil {
				err := WatchKeep(ctx, js, keys, KeepWatchOptions{}, func(u KeepUpdate) {
					backoff = time.Second
					switch {
					case u.Synced:
						if !a.watching.Swap(true) && syncS[i] == 0 {
							syncS[i] = time.Since(t0).Seconds()
							synced.Add(1)
							release()
						}
					case u.Key != "":
						a.record(u.Key, u.List.Revision, time.Now().UnixNano())
					}
				})
				a.watching.Store(false)
				if ctx.Err() != nil {
					return
				}
				restarts.Add(1)
				cause := KeepWatchCause(err)
				causeMu.Lock()
				if causes[cause]++; causes[cause] == 1 {
					fmt.Fprintf(os.Stderr, "keep fleet child %d: first watch failure of cause %s: %v\n", cfg.From, cause, err)
				}
				causeMu.Unlock()
				// The agent's backoff (internal/agent/keepwatch.go).
				select {
				case <-ctx.Done():
				case <-time.After(backoff/2 + rand.N(backoff/2+1)):
				}
				backoff = min(2*backoff, time.Minute)
			}
		}()
	}
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	report := func(r keepReport) {
		r.Synced, r.Restarts = int(synced.Load()), restarts.Load()
		for _, a := range agents {
			if a.watching.Load() {
				r.Watching++
			}
		}
		causeMu.Lock()
		r.Causes = maps.Clone(causes)
		causeMu.Unlock()
		r.RSSKiB, r.CPUSeconds = rssKiB(), selfCPU().Seconds()
		outMu.Lock()
		_ = enc.Encode(r)
		outMu.Unlock()
	}
	go func() {
		for t := time.Now(); synced.Load() < int64(cfg.Count); {
			time.Sleep(100 * time.Millisecond)
			if time.Since(t) > 30*time.Second {
				t = time.Now()
				causeMu.Lock()
				fmt.Fprintf(os.Stderr, "keep fleet child %d: %d of %d agents synced, %d watches made again %v\n", cfg.From, synced.Load(), cfg.Count, restarts.Load(), causes)
				causeMu.Unlock()
			}
		}
		report(keepReport{Cmd: "ready", SyncSeconds: syncS})
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "stats":
			report(keepReport{Cmd: "stats"})
		case "collect": // collect KEY REV DEADLINE: every agent's arrival of KEY at REV, waiting until DEADLINE at most
			rev, _ := strconv.ParseUint(f[2], 10, 64)
			dl, _ := strconv.ParseInt(f[3], 10, 64)
			arr := make([]int64, len(agents))
			for {
				n := 0
				for i, a := range agents {
					if arr[i] == 0 {
						arr[i] = a.arrival(f[1], rev)
					}
					if arr[i] != 0 {
						n++
					}
				}
				if n == len(agents) || time.Now().UnixNano() > dl {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			report(keepReport{Cmd: "collect", Arrivals: arr})
		}
	}
	cancel()
	wg.Wait()
	return 0
}

// keepChild is the parent's handle on a keep fleet child process.
type keepChild struct {
	stdin   io.WriteCloser
	reports chan keepReport
}

func startKeepChild(b *testing.B, cfg keepChildConfig) *keepChild {
	js, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), keepFleetChildEnv+"="+string(js))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &keepChild{stdin: stdin, reports: make(chan keepReport, 16)}
	go func() {
		defer close(c.reports)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r keepReport
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				c.reports <- r
			}
		}
	}()
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	return c
}

func (c *keepChild) send(b *testing.B, line string) {
	if _, err := fmt.Fprintln(c.stdin, line); err != nil {
		b.Fatalf("keep fleet child: %v", err)
	}
}

func (c *keepChild) wait(b *testing.B, cmd string, within time.Duration) keepReport {
	select {
	case r, ok := <-c.reports:
		if !ok || r.Cmd != cmd {
			b.Fatalf("keep fleet child: want %s report, got %+v (ok %v)", cmd, r, ok)
		}
		return r
	case <-time.After(within):
		b.Fatalf("keep fleet child: no %s report within %s", cmd, within)
	}
	return keepReport{}
}

// BenchmarkFleetKeepReach: GCAGENT_FLEET_AGENTS (10,000) simulated agents
// in processes of GCAGENT_FLEET_PER_PROCESS (5,000), each with its own NATS
// connection and the keep list watch the agent runs (WatchKeep of all,
// clusters.<cluster> and declared.<cluster>.>: three ephemeral consumers),
// against three clustered nats-servers (child processes) holding the keep
// bucket R3 with an operator list and a cluster list of
// GCAGENT_KEEPREACH_IMAGES (20,000) images, written as gcagent-cluster
// writes it (declared.Layout's shards, then the head, rewritten every 30 s
// as its heartbeat). Then GCAGENT_KEEPREACH_ROUNDS (3) times: (a) an
// operator change of all, (b) a new image in one shard of the cluster list
// plus its head. For each, per agent, the time from the write's ack to the
// agent's update callback: p50, p99, max and the agents that did not get it
// within 10 s (for (b), the shard's ack to the head's callback: the change
// is whole when its head is read). Also the servers' CPU and RSS at rest
// without agents, at rest with them (consumers per server) and during the
// changes, and the fleet's first sync. The bucket's stream takes
// GCAGENT_KEEPREACH_MAX_CONSUMERS (ten per agent) consumers: the server's
// default, 1,000 per stream, holds 333 agents' watches. With GCAGENT_KEEPREACH_PROFILE_DIR,
// a CPU profile of each server during the first change of each kind.
func BenchmarkFleetKeepReach(b *testing.B) {
	agents := envInt("GCAGENT_FLEET_AGENTS", 10_000)
	perProc := envInt("GCAGENT_FLEET_PER_PROCESS", 5_000)
	images := envInt("GCAGENT_KEEPREACH_IMAGES", 20_000)
	rounds := envInt("GCAGENT_KEEPREACH_ROUNDS", 3)
	rest := envDuration("GCAGENT_KEEPREACH_REST", 30*time.Second)
	for range b.N {
		runFleetKeepReach(b, agents, perProc, images, rounds, rest)
	}
}

// keepWriter writes the keep bucket as an operator (all) and as
// gcagent-cluster (the cluster list: shards, then the head by
// compare-and-set, the head again every heartbeat).
type keepWriter struct {
	kv      jetstream.KeyValue
	cluster string
	mu      sync.Mutex
	entries []declared.Entry
	written map[string][]byte
	head    declared.Head
	headRev uint64
}

// write lays the entries out and writes every shard that changed, then
// the head; it returns the first shard's ack time and revision, and the
// head's revision.
func (w *keepWriter) write(ctx context.Context) (firstAck time.Time, shardRev, headRev uint64, changed []string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	shards := declared.Layout(w.entries, 0)
	for i, s := range shards {
		key := declared.ShardKey(w.cluster, len(shards), i)
		v, _ := json.Marshal(s)
		if bytes.Equal(w.written[key], v) {
			continue
		}
		rev, err := w.kv.Put(ctx, key, v)
		if err != nil {
			return firstAck, 0, 0, nil, fmt.Errorf("put %s: %w", key, err)
		}
		if shardRev == 0 {
			firstAck, shardRev = time.Now(), rev
		}
		w.written[key] = v
		changed = append(changed, key)
	}
	now := time.Now().UTC()
	w.head = declared.Head{State: declared.Complete, Shards: len(shards), Images: len(w.entries), Workloads: len(w.entries),
		Kinds: []string{"Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"}, Namespaces: []string{"*"},
		ReleaseAfterS: 3600, Heartbeat: now, HeartbeatEveryS: 30, Since: now, By: "gcagent-cluster-bench"}
	headRev, err = w.putHead(ctx)
	return firstAck, shardRev, headRev, changed, err
}

func (w *keepWriter) putHead(ctx context.Context) (uint64, error) {
	v, _ := json.Marshal(w.head)
	key := declared.HeadKey(w.cluster)
	var rev uint64
	var err error
	if w.headRev == 0 {
		rev, err = w.kv.Create(ctx, key, v)
	} else {
		rev, err = w.kv.Update(ctx, key, v, w.headRev)
	}
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", key, err)
	}
	w.headRev = rev
	return rev, nil
}

// heartbeat rewrites the head, as the component does every 30 s.
func (w *keepWriter) heartbeat(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.head.Heartbeat = time.Now().UTC()
	_, err := w.putHead(ctx)
	return err
}

// benchEntry is image i of the cluster list, declared by one workload.
func benchEntry(i int) declared.Entry {
	kinds := []string{"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"}
	return declared.Entry{Image: fmt.Sprintf("registry.example.com/team-%03d/service-%05d:v1.%d", i%100, i, i%7),
		By: []declared.Workload{{Kind: kinds[i%6], Namespace: fmt.Sprintf("ns-%03d", i%100), Name: fmt.Sprintf("w-%05d", i)}}}
}

// serverSampler samples the servers' CPU and RSS every 100 ms.
type serverSampler struct {
	servers []*fleetServer
	cpu0    []time.Duration
	t0      time.Time
	peak    []int64
	stop    chan struct{}
	done    chan struct{}
}

func sampleServers(servers []*fleetServer) *serverSampler {
	s := &serverSampler{servers: servers, cpu0: make([]time.Duration, len(servers)), peak: make([]int64, len(servers)),
		stop: make(chan struct{}), done: make(chan struct{}), t0: time.Now()}
	for i, srv := range servers {
		s.cpu0[i], s.peak[i] = srv.stat()
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				for i, srv := range servers {
					_, rss := srv.stat()
					s.peak[i] = max(s.peak[i], rss)
				}
			}
		}
	}()
	return s
}

// end returns each server's CPU (cores, the share of one core over the
// window) and peak RSS (MiB) since the sampler started.
func (s *serverSampler) end() (cores []float64, peakMiB []float64, window time.Duration) {
	close(s.stop)
	<-s.done
	window = time.Since(s.t0)
	for i, srv := range s.servers {
		cpu, rss := srv.stat()
		cores = append(cores, (cpu-s.cpu0[i]).Seconds()/window.Seconds())
		peakMiB = append(peakMiB, float64(max(s.peak[i], rss))/1024)
	}
	return cores, peakMiB, window
}

func fmtList(xs []float64, f string) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf(f, x))
	}
	return strings.Join(parts, " / ")
}

func runFleetKeepReach(b *testing.B, agents, perProc, images, rounds int, rest time.Duration) {
	const cluster = "bench"
	profileDir := os.Getenv("GCAGENT_KEEPREACH_PROFILE_DIR")
	servers, allURLs := startFleetServers(b, profileDir != "")
	admin, err := nats.Connect(allURLs, nats.MaxReconnects(-1))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	js, _ := jetstream.New(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	var kv jetstream.KeyValue
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err = EnsureKeepBucket(cctx, js, 3, 64<<20) // as gcagent-cluster makes it
		ccancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("R3 keep bucket: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A server takes at most 1,000 consumers per stream unless the stream
	// or the account says otherwise (nats-server's
	// JSDefaultMaxConsumersPerStream; -1 counts as not said), and each
	// agent's watch holds three: on a fleet's NATS the operator lifts it
	// (jetstream { limits { default_max_consumers: -1 } }, or the bucket's
	// stream max_consumers), as the bench does for the bucket here.
	maxConsumers := envInt("GCAGENT_KEEPREACH_MAX_CONSUMERS", 10*agents)
	st, err := js.Stream(ctx, "KV_"+KeepBucket)
	if err != nil {
		b.Fatal(err)
	}
	scfg := st.CachedInfo().Config
	scfg.MaxConsumers = maxConsumers
	if _, err := js.UpdateStream(ctx, scfg); err != nil {
		b.Fatalf("keep bucket's stream: max consumers %d: %v", maxConsumers, err)
	}
	putList := func(key string, patterns ...string) (time.Time, uint64) {
		v, _ := json.Marshal(KeepList{Patterns: patterns, UpdatedAt: time.Now().UTC(), UpdatedBy: "operator"})
		rev, err := kv.Put(ctx, key, v)
		if err != nil {
			b.Fatalf("put %s: %v", key, err)
		}
		return time.Now(), rev
	}
	putList(KeepAllKey, "registry.example.com/base/*")
	putList(KeepClusterKey(cluster), "registry.example.com/team-000/*")
	w := &keepWriter{kv: kv, cluster: cluster, written: map[string][]byte{}}
	for i := range images {
		w.entries = append(w.entries, benchEntry(i))
	}
	if _, _, _, _, err := w.write(ctx); err != nil {
		b.Fatal(err)
	}
	layout := w.head.Shards
	var listBytes int
	for _, v := range w.written {
		listBytes += len(v)
	}
	hbCtx, hbCancel := context.WithCancel(ctx)
	defer hbCancel()
	var hbErrs atomic.Int64
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				cctx, ccancel := context.WithTimeout(hbCtx, 10*time.Second)
				if w.heartbeat(cctx) != nil {
					hbErrs.Add(1)
				}
				ccancel()
			}
		}
	}()

	// At rest without agents.
	s := sampleServers(servers)
	time.Sleep(min(rest, 10*time.Second))
	bareCores, bareMiB, _ := s.end()

	// The fleet, and its first sync.
	t0 := time.Now()
	var children []*keepChild
	for from := 0; from < agents; from += perProc {
		children = append(children, startKeepChild(b, keepChildConfig{URLs: allURLs, Cluster: cluster, From: from,
			Count: min(perProc, agents-from), Parallel: 50}))
	}
	s = sampleServers(servers)
	var syncS []float64
	var agentRSS int64
	for _, c := range children {
		r := c.wait(b, "ready", 30*time.Minute)
		syncS = append(syncS, r.SyncSeconds...)
	}
	firstSync := time.Since(t0)
	syncCores, syncMiB, _ := s.end()
	slices.Sort(syncS)
	b.Logf("%d agents in %d processes connected and synced (%d keys, %d KiB of cluster list each) in %s",
		agents, len(children), 3+layout, listBytes>>10, firstSync.Round(time.Millisecond))
	all := func(line, cmd string, within time.Duration) []keepReport {
		for _, c := range children {
			c.send(b, line)
		}
		var out []keepReport
		for _, c := range children {
			out = append(out, c.wait(b, cmd, within))
		}
		return out
	}
	sumRestarts := func(rs []keepReport) (n int64, causes map[string]int, watching int) {
		causes = map[string]int{}
		for _, r := range rs {
			n += r.Restarts
			watching += r.Watching
			for k, v := range r.Causes {
				causes[k] += v
			}
		}
		return n, causes, watching
	}

	// At rest with the fleet.
	time.Sleep(10 * time.Second)
	before := all("stats", "stats", time.Minute)
	s = sampleServers(servers)
	time.Sleep(rest)
	restCores, restMiB, _ := s.end()
	after := all("stats", "stats", time.Minute)
	r0, _, _ := sumRestarts(before)
	r1, restCauses, watching := sumRestarts(after)
	for _, r := range after {
		agentRSS += r.RSSKiB
	}
	perServer, total := consumersByServer(b, ctx, js)

	// The changes.
	lat := map[string][]time.Duration{}
	missed := map[string]int{}
	var changeCores, changeMiB [][]float64
	collect := func(kind, key string, rev uint64, ack time.Time) {
		dl := ack.Add(10 * time.Second)
		for _, r := range all(fmt.Sprintf("collect %s %d %d", key, rev, dl.UnixNano()), "collect", time.Minute) {
			for _, at := range r.Arrivals {
				if at == 0 {
					missed[kind]++
					continue
				}
				lat[kind] = append(lat[kind], time.Unix(0, at).Sub(ack))
			}
		}
	}
	profile := func(tag string) func() {
		if profileDir == "" {
			return func() {}
		}
		var wg sync.WaitGroup
		for _, srv := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=8", srv.profPort))
				if err != nil {
					b.Logf("profile %s: %v", srv.name, err)
					return
				}
				defer resp.Body.Close()
				f, _ := os.Create(filepath.Join(profileDir, fmt.Sprintf("keepreach-%s-%s.pb.gz", tag, srv.name)))
				_, _ = io.Copy(f, resp.Body)
				f.Close()
			}()
		}
		time.Sleep(200 * time.Millisecond) // the profiles have started
		return wg.Wait
	}
	for round := range rounds {
		// (a) An operator change of all.
		wait := func() {}
		if round == 0 {
			wait = profile("all")
		}
		s = sampleServers(servers)
		ack, rev := putList(KeepAllKey, "registry.example.com/base/*", fmt.Sprintf("registry.example.com/pinned/round-%d:*", round))
		collect("all", KeepAllKey, rev, ack)
		c, m, _ := s.end()
		changeCores, changeMiB = append(changeCores, c), append(changeMiB, m)
		wait()
		time.Sleep(2 * time.Second)

		// (b) A new image in one shard of the cluster list, and its head.
		if round == 0 {
			wait = profile("shard")
		}
		s = sampleServers(servers)
		w.mu.Lock()
		w.entries = append(w.entries, benchEntry(images+round))
		w.mu.Unlock()
		ack, shardRev, headRev, changed, err := w.write(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(changed) != 1 || w.head.Shards != layout {
			b.Fatalf("a new image changed %v (layout %d → %d): want one shard", changed, layout, w.head.Shards)
		}
		collect("shard", changed[0], shardRev, ack)
		collect("head", declared.HeadKey(cluster), headRev, ack)
		c, m, _ = s.end()
		changeCores, changeMiB = append(changeCores, c), append(changeMiB, m)
		wait()
		time.Sleep(2 * time.Second)
	}
	end := all("stats", "stats", time.Minute)
	r2, endCauses, _ := sumRestarts(end)
	b.StopTimer()

	pct := func(d []time.Duration, q float64) float64 {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(float64(len(d))*q))].Microseconds()) / 1000
	}
	pctF := func(d []float64, q float64) float64 {
		if len(d) == 0 {
			return 0
		}
		return d[min(len(d)-1, int(float64(len(d))*q))]
	}
	maxOf := func(xs [][]float64) []float64 {
		out := make([]float64, len(servers))
		for _, x := range xs {
			for i, v := range x {
				out[i] = max(out[i], v)
			}
		}
		return out
	}
	fmt.Printf("\nkeep reach: %d agents (%d processes) × 3 watchers, 3 servers, keep bucket R3 (its max consumers set to %d); cluster list %d images in %d shards (%d KiB), %d rounds\n",
		agents, len(children), maxConsumers, images, layout, listBytes>>10, rounds)
	fmt.Printf("first sync: every agent synced %.1f s after the first connect (per agent p50 %.2f s, p99 %.2f s, at most 50 per process at once); servers %s cores, peak RSS %s MiB\n",
		firstSync.Seconds(), pctF(syncS, 0.5), pctF(syncS, 0.99), fmtList(syncCores, "%.2f"), fmtList(syncMiB, "%.0f"))
	fmt.Printf("at rest without agents: servers %s cores, RSS %s MiB\n", fmtList(bareCores, "%.3f"), fmtList(bareMiB, "%.0f"))
	fmt.Printf("at rest with the fleet (%s): %d consumers on the keep bucket (%s by server), %d of %d watches synced; servers %s cores, RSS %s MiB; %d watches made again during the rest (%v since the start)\n",
		rest, total, perServerString(perServer, servers), watching, agents, fmtList(restCores, "%.3f"), fmtList(restMiB, "%.0f"), r1-r0, restCauses)
	fmt.Printf("agents: %.0f KiB RSS per agent (%d MiB in %d processes)\n", float64(agentRSS)/float64(agents), agentRSS/1024, len(children))
	for _, k := range []string{"all", "shard", "head"} {
		what := map[string]string{"all": "(a) operator key all: its ack to the callback", "shard": "(b) the shard: its ack to its callback",
			"head": "(b) the whole change: the shard's ack to the head's callback"}[k]
		fmt.Printf("%s: p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d of %d not within 10 s\n",
			what, pct(lat[k], 0.5), pct(lat[k], 0.99), pct(lat[k], 1), missed[k], agents*rounds)
	}
	fmt.Printf("during the changes: servers at most %s cores, peak RSS %s MiB; %d watches made again over the whole run (%v); %d head heartbeats failed\n",
		fmtList(maxOf(changeCores), "%.2f"), fmtList(maxOf(changeMiB), "%.0f"), r2, endCauses, hbErrs.Load())
	b.ReportMetric(float64(agents), "agents")
	b.ReportMetric(pct(lat["all"], 0.99), "all-p99-ms")
	b.ReportMetric(pct(lat["head"], 0.5), "shard-head-p50-ms")
	b.ReportMetric(pct(lat["head"], 0.99), "shard-head-p99-ms")
	b.ReportMetric(pct(lat["head"], 1), "shard-head-max-ms")
	b.ReportMetric(float64(missed["all"]+missed["head"]), "missed-10s")
	b.ReportMetric(firstSync.Seconds(), "first-sync-s")
	b.ReportMetric(float64(total), "consumers")
	var restSum, restRSS float64
	for i := range servers {
		restSum += restCores[i]
		restRSS += restMiB[i] - bareMiB[i]
	}
	b.ReportMetric(restSum, "rest-server-cores")
	b.ReportMetric(restRSS*1024/float64(agents), "rest-server-KiB/agent")
}

// consumersByServer counts the keep bucket's consumers by the server that
// hosts each (its leader).
func consumersByServer(b *testing.B, ctx context.Context, js jetstream.JetStream) (map[string]int, int) {
	st, err := js.Stream(ctx, "KV_"+KeepBucket)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int{}
	total := 0
	l := st.ListConsumers(ctx)
	for ci := range l.Info() {
		total++
		if ci.Cluster != nil {
			out[ci.Cluster.Leader]++
		}
	}
	if err := l.Err(); err != nil {
		b.Logf("list consumers: %v (counted %d)", err, total)
	}
	return out, total
}

func perServerString(m map[string]int, servers []*fleetServer) string {
	var parts []string
	for _, s := range servers {
		parts = append(parts, strconv.Itoa(m[s.name]))
	}
	return strings.Join(parts, " / ")
}
