package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/gcagent/gcagent/trace"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// agent is the running daemon's parts. Each component (image GC, container
// GC, logs, NATS) adds its field and starts from run.
type agent struct {
	cfg Config
	log zerolog.Logger
	reg *prometheus.Registry
	// live is the projection of every managed namespace.
	live    *projection.Spaces
	source  *node.Source
	runtime *node.Runtime
	// deletes begins every delete's transaction and settles unknown outcomes.
	deletes *deletion.Manager
	// version asks containerd for its version: the /readyz probe that it
	// answers, not only that its socket is open.
	version func(context.Context) (client.Version, error)
	// imageFS is the filesystem image GC measures (--image-fs, or CRI's).
	imageFS *node.ImageFS
	pub     gc.Publisher
	bus     *bus
	// lastGC, set by the image GC component, reports its last pass for
	// heartbeats and /status.
	lastGC func() *schema.LastGC
	// statusErr is the last error of a status put, logged once (one put at a time: bus.statusBusy).
	statusErr string
	// runGCNow, set by the image GC component, runs a pass now (control verb gc).
	runGCNow func(ctx context.Context) (any, error)
	// imageGC deletes images by disk usage and age (imagegc.go); it
	// measures from the start, and passes once imageGCReady closes.
	imageGC      *gc.ImageGC
	imageGCReady chan struct{}
	// containerGC removes dead containers (containergc.go).
	containerGC *gc.ContainerGC
	// logs cleans the log dirs (logs.go); podDirs is what it has seen of
	// the pod log dir, the container GC's deleted-pod sign.
	logs    *logs.Cleaner
	podDirs *logs.PodDirs
	// evs is the projection's input: the node's events, and the events
	// the agent journals itself (record).
	evs chan events.Scoped
	// keep is the fleet keep list (keeplist.go); regrets reports images
	// that came back after image GC deleted them.
	keep    *fleetKeep
	regrets *gc.RegretReporter
	// clock is the one time every planner reads (internal/clock: a
	// wall-clock step, running or while down, moves no age).
	clock *clock.Clock
	// kubelet follows the kubelet's config (kubelet.go); nil without
	// --kubelet-config.
	kubelet *kubeletFollower
	// store is the state file; trace, the usage trace in it (nil: off).
	store *projection.Store
	trace *trace.Log
	// lock is containerd's agent lock (one agent per containerd): every
	// delete needs it held; lockTaken is closed once it is.
	lock      *node.AgentLock
	lockTaken <-chan struct{}
}

// Run is the daemon: it returns when ctx ends or a part fails for good.
func Run(ctx context.Context, cfg Config, logOut io.Writer) error {
	sampleAllocations(cfg.Profiling)
	log := NewLogger(cfg, logOut)
	nss, err := cfg.Namespaces()
	if err != nil {
		return err
	}
	// The first line says what runs and with which policy.
	policyLog(log.Info(), cfg.Policy()).Str("version", version.Version).Str("containerd", cfg.ContainerdAddress).Str("namespaces", nss.String()).
		Strs("exclude_namespaces", nss.Exclude).
		Str("state_dir", cfg.StateDir).Str("metrics", cfg.MetricsAddress).Bool("dry_run", cfg.DryRun).Msg("gcagent starting")
	// What ran so far (every package's init, the configuration) never runs
	// again: its pages go back before the first listing, the agent's
	// peak, touches what it needs.
	returnBinaryPages(log.With().Str("component", "memory").Logger(), "starting: the binary's pages the process's init used returned to the kernel")
	// An agent refused (another holds containerd) leaves nothing of this
	// start behind: a new state dir would say an agent ran there.
	made, refused := newInStateDir(cfg.StateDir), false
	defer func() {
		if refused {
			made.remove()
		}
	}()
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	clk, skew, clockFile, err := continueClock(cfg, log)
	if err != nil {
		return err
	}
	if err := testCallTimeout(log); err != nil { // only in a build with -tags testhooks
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// client.New does not dial: containerd may come later, and the Source
	// retries until it does. No default namespace: every call names its own.
	cl, err := client.New(cfg.ContainerdAddress, node.ClientOpts()...)
	if err != nil {
		return fmt.Errorf("containerd client: %w", err)
	}
	defer cl.Close()
	criConn, err := node.DialCRI(cfg.ContainerdAddress)
	if err != nil {
		return err
	}
	defer criConn.Close()
	cri := runtimeapi.NewRuntimeServiceClient(criConn)

	// The first listing starts while the persisted projection is restored:
	// containerd takes longer to list a busy node than the agent to restore
	// it. What the listing asks of the projection waits for the restore.
	ctx, cancel := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	defer func() { cancel(); _ = g.Wait() }() // a start that fails stops the listing
	var live *projection.Spaces
	restored := make(chan struct{})
	restoredLive := func() *projection.Spaces {
		select {
		case <-restored:
			return live
		case <-gctx.Done():
			return nil
		}
	}
	src := newSource(cfg, cl, cri, nss, clk, skew, restoredLive, log, reg)
	evs := make(chan events.Scoped, 1024)
	g.Go(func() error { return src.Run(gctx, evs) })

	store, reset, err := projection.OpenStoreOrReset(filepath.Join(cfg.StateDir, "state.db"), clk.Now())
	if err != nil {
		return err
	}
	defer store.Close()
	// The state dir is locked: now containerd, whatever the state dir.
	lock, lockTaken, err := holdContainerd(gctx, g, cfg, cl, clk, log)
	if err != nil {
		var held *node.HeldError
		refused = errors.As(err, &held)
		return err
	}
	defer lock.Release() // after every part has stopped: g.Wait below
	tl, err := openTrace(cfg, store, clk.Now(), log, reg)
	if err != nil {
		return err
	}
	live, err = projection.NewSpaces(projection.SpacesOptions{
		Store: store, Managed: nss.Match, Registerer: reg,
		Live:       projection.LiveOptions{Log: log.With().Str("component", "projection").Logger(), Now: clk.Now},
		AfterRound: returnListing(log.With().Str("component", "projection").Logger()),
	})
	if err != nil {
		return err
	}
	close(restored)
	a := &agent{cfg: cfg, log: log, reg: reg, live: live, source: src, pub: gc.Discard{}, clock: clk, store: store, trace: tl,
		lock: lock, lockTaken: lockTaken, imageGCReady: make(chan struct{}),
		runtime: node.NewRuntime(cl, cri, runtimeapi.NewImageServiceClient(criConn))}
	a.runtime.Nerdctl = node.Nerdctl{DataRoot: cfg.NerdctlDataRoot}
	if skew != nil {
		a.runtime.StampSkew = skew.At // as the Source's: creation times compare with the projection's
	}
	a.evs = evs
	a.keep = loadFleetKeep(cfg.StateDir, cfg.Cluster, keepSource(cfg), cfg.KeepListWait, clk.Now, log.With().Str("component", "keeplist").Logger())
	reg.MustRegister(keepMetrics{a.keep}, a.keep.failures, failClosedMetrics{a})
	a.version = cl.Version
	a.imageFS = node.NewImageFS(cfg.ImageFS, DefaultContainerdRoot, a.runtime.CRIImages)

	b, err := a.startNATS()
	if err != nil {
		return err
	}
	defer b.close() // after every component has stopped: flushes the outbox
	if err := a.useBus(b); err != nil {
		return err
	}
	a.reportStateReset(reset)
	// Components that subscribe to the projection are set up before it runs.
	if err := a.setupComponents(); err != nil {
		return err
	}
	reg.MustRegister(newOpsCollector(a))
	a.reportKubelet()
	boot := time.Now().UTC()
	_ = a.pub.Publish(a.startedAction(boot))

	ln, err := net.Listen("tcp", cfg.MetricsAddress)
	if err != nil {
		return fmt.Errorf("metrics address: %w", err)
	}
	srv := &http.Server{Handler: a.routes(reg), ReadHeaderTimeout: 5 * time.Second}

	a.start(g, gctx, evs, srv, ln, boot, skew, clockFile)
	err = g.Wait()
	log.Info().Msg("gcagent stopped")
	return err
}

// inStateDir is what of a state dir existed before this start: the dir,
// and the files an agent writes before it knows containerd is its own.
type inStateDir struct {
	dir     string
	existed map[string]bool // by path; the dir too
}

func newInStateDir(dir string) inStateDir {
	m := inStateDir{dir: dir, existed: map[string]bool{}}
	for _, p := range []string{dir, filepath.Join(dir, "state.db"), filepath.Join(dir, stateIDFile)} {
		_, err := os.Lstat(p)
		m.existed[p] = err == nil
	}
	return m
}

// remove deletes what this start made of m (call it after the store is
// closed): the files it wrote, and the dir if it made it and nothing else
// is in it.
func (m inStateDir) remove() {
	for p, existed := range m.existed {
		if !existed && p != m.dir {
			_ = os.Remove(p)
		}
	}
	if !m.existed[m.dir] {
		_ = os.Remove(m.dir) // fails when not empty: then it stays
	}
}

// continueClock is the agent's clock, going on from the time it saved in
// the state dir (a wall-clock step while it was down moves no age), with
// the emulated offset a test build may ask for.
func continueClock(cfg Config, log zerolog.Logger) (clk *clock.Clock, skew *clock.Skew, file string, err error) {
	// skew is nil unless a test build emulates wall-clock steps.
	if skew, err = testSkew(cfg.StateDir); err != nil {
		return nil, nil, "", err
	}
	file = filepath.Join(cfg.StateDir, clock.File)
	clk, stepped := clock.Continue(skew, file)
	if stepped != 0 {
		log.Warn().Str("component", "clock").Float64("step_s", stepped.Seconds()).
			Msg("the wall clock stepped while the agent was down; ages go on from the agent's own time")
	}
	return clk, skew, file, nil
}

// useBus publishes through b, and makes its outbox the journal of the
// delete transactions.
func (a *agent) useBus(b *bus) error {
	a.bus, a.pub = b, b.pub
	var err error
	a.deletes, err = newDeletes(b.pub, a.runtime, a.lock, a.log)
	return err
}

// newSource is the node's event source for cfg: what it would look up
// again of an image or a container the restored projection already knows
// (restoredLive waits for the restore) costs no call.
func newSource(cfg Config, cl *client.Client, cri runtimeapi.RuntimeServiceClient, nss events.Namespaces, clk *clock.Clock,
	skew *clock.Skew, restoredLive func() *projection.Spaces, log zerolog.Logger, reg prometheus.Registerer) *node.Source {
	return node.NewSource(node.Options{
		Client: cl, CRI: cri, Namespaces: nss, ResyncInterval: cfg.ResyncInterval, Now: clk.Now, StampSkew: skew.At,
		KnownFacts: func(digest string) (f node.ImageFacts) {
			// Content is shared by every namespace: any one's facts will do.
			if live := restoredLive(); live != nil {
				live.View(func(s *projection.State) {
					if img := s.Images[digest]; img != nil && f.Size == 0 {
						f = node.ImageFacts{Size: img.Size, Config: img.ConfigDigest, Chain: img.ChainID}
					}
				})
			}
			return f
		},
		KnownContainer: func(ns, id string, created time.Time) (f node.ContainerFacts, ok bool) {
			if live := restoredLive(); live != nil {
				if l := live.Live(ns); l != nil {
					l.View(func(s *projection.State) {
						if c := s.Containers[id]; c != nil && c.Created == projection.StampOf(created) {
							f, ok = node.ContainerFacts{SandboxID: c.SandboxID, ImageID: c.ImageID, VolumeImageIDs: slices.Clone(c.VolumeImageIDs())}, true
						}
					})
				}
			}
			return f, ok
		},
		Log: log.With().Str("component", "events").Logger(), Registerer: reg,
	})
}

// setupComponents builds the image GC, the container GC and the log
// cleaner, each subscribed to the projection (call it before the
// projection runs), and says which filesystem image GC measures.
func (a *agent) setupComponents() error {
	if err := a.setupImageGC(); err != nil {
		return err
	}
	a.loadPodDirs()
	if err := a.setupContainerGC(); err != nil {
		return err
	}
	if err := a.setupLogs(); err != nil {
		return err
	}
	if note := a.imageFS.Note(); note != "" {
		a.log.Warn().Str("component", "imagegc").Str("image_fs", a.imageFS.Chosen()).Msg(note)
	} else {
		a.log.Info().Str("component", "imagegc").Str("image_fs", a.imageFS.Chosen()).Msg("measuring the image filesystem")
	}
	return nil
}

// start runs every part of the agent in g: the projection, heartbeats,
// the clock's saving, memory return, systemd, control requests, the HTTP
// endpoints and, once the deletes a crash left are settled, the GC
// components.
func (a *agent) start(g *errgroup.Group, gctx context.Context, evs chan events.Scoped, srv *http.Server, ln net.Listener,
	boot time.Time, skew *clock.Skew, clockFile string) {
	log, cfg := a.log, a.cfg
	if sd := a.newSystemdNotify(evs); sd != nil { // before live.Run: it subscribes
		g.Go(func() error { return sd.run(gctx) })
	}
	g.Go(func() error { return a.live.Run(gctx, evs) })
	g.Go(func() error { return a.runHeartbeat(gctx, a.bus, boot) })
	g.Go(func() error { return saveClock(gctx, a.clock, clockFile, log) })
	g.Go(func() error {
		return returnWhenQuiet(gctx, log.With().Str("component", "memory").Logger(), a.live.Synced)
	})
	g.Go(func() error { a.preflight(gctx); return nil })
	g.Go(func() error { return a.followKubelet(gctx) })
	if skew != nil {
		g.Go(func() error {
			return followTestSkew(gctx, skew, filepath.Join(cfg.StateDir, clock.TestOffsetFile), log)
		})
	}
	// Deletes a crash left are settled before anything deletes, and
	// nothing deletes before this agent holds containerd's agent lock.
	resolved := make(chan struct{})
	g.Go(func() error { return a.deletes.Run(gctx, func() { close(resolved) }) })
	afterIntents := func(run func(context.Context) error) func() error {
		return func() error {
			for _, ready := range []<-chan struct{}{resolved, a.lockTaken} {
				select {
				case <-ready:
				case <-gctx.Done():
					return nil
				}
			}
			if a.lock.WaitHeld(gctx) != nil {
				return nil
			}
			return run(gctx)
		}
	}
	// Components that act on the projection start here, one g.Go each.
	// Image GC measures from the start; its first pass follows the keep
	// list's first watch (bounded:
	// a NATS that does not answer leaves it unknown, which the planner
	// keeps for), so that a list NATS gives is read before anything goes.
	g.Go(afterIntents(func(ctx context.Context) error { a.keep.firstTry(ctx); close(a.imageGCReady); return nil }))
	g.Go(func() error { return a.runImageGC(gctx) })
	g.Go(func() error { a.nudgeImageGCOnLock(gctx); return nil })
	g.Go(func() error { return a.runControl(gctx) })
	g.Go(func() error { return a.keep.run(gctx, a.bus.nc, a.cfg.NATSJSDomain, a.bus.emb != nil) })
	g.Go(func() error { a.keep.awaitRead(gctx, clock.System(a.clock.Now)); return nil })
	g.Go(func() error { return a.regrets.Run(gctx) })
	g.Go(afterIntents(a.containerGC.Run))
	g.Go(afterIntents(a.runLogs))
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
}

// StatusDoc is /status: the projection report's fields at the top level (so
// clients reading a projection.Report keep working), plus each component's
// state in an optional field.
type StatusDoc struct {
	projection.Report
	// Policy is the settings in force and where each came from.
	Policy  []Setting         `json:"policy"`
	ImageGC *gc.ImageGCStatus `json:"imageGC,omitempty"`
	// ContainerGC is the container GC's last pass; Logs the log cleaner's.
	ContainerGC *gc.ContainerGCStatus `json:"containerGC,omitempty"`
	Logs        *logs.Plan            `json:"logs,omitempty"`
}

func (a *agent) routes(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	// Uncompressed: the page is about 20 KB, and each gzip'd scrape took a
	// 3.4 MiB compressor (the handler's pool of them empties at each
	// collection), garbage an idle agent kept until its next collection.
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{DisableCompression: true}))
	if a.cfg.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /trace", a.serveTrace)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		var problems []string
		if !a.source.Connected() {
			problems = append(problems, "containerd: not connected")
		} else if err := a.containerdAnswers(r.Context()); err != nil {
			// Connected but not answering (stopped, overloaded): GC calls
			// time out meanwhile; ready again as soon as it answers.
			problems = append(problems, "containerd: not answering: "+err.Error())
		}
		if !a.live.Synced() {
			problems = append(problems, "projection: not synced")
		}
		for _, n := range a.kubeletNotes() {
			defer fmt.Fprintln(w, "kubelet:", n) // not a readiness failure: GC goes on
		}
		if note := a.imageFS.Note(); note != "" {
			// Not a readiness failure: GC measures the filesystem it says.
			defer fmt.Fprintln(w, "image-fs:", note)
		}
		if p := a.bus.problem(); p != "" {
			// Not a readiness failure either: GC goes on and events wait in
			// the outbox; only local NATS clients miss them meanwhile.
			defer fmt.Fprintln(w, "nats: "+p)
		}
		if a.bus != nil && a.bus.pub.Mode() == natsbus.ModeCore {
			// Not a readiness failure: GC goes on; events lose their dedupe.
			defer fmt.Fprintln(w, "nats: core publish (the server has no JetStream)")
		}
		if a.logs != nil {
			// Not a readiness failure: the links are kept, GC goes on.
			for _, p := range a.logs.Problems() {
				defer fmt.Fprintln(w, "logs: "+p)
			}
		}
		if d := a.journalDetail(); d != "" {
			defer fmt.Fprintln(w, d) // not a readiness failure: GC goes on
		}
		if d := a.keep.detail(a.clock.Now()); d != "" {
			defer fmt.Fprintln(w, d) // not a readiness failure: GC keeps what the list could protect
		}
		if err := a.lock.Held(); err != nil {
			// Not a readiness failure: nothing is deleted until it holds
			// containerd's agent lock again (or first).
			defer fmt.Fprintln(w, "agent lock: "+err.Error())
		}
		if a.cfg.DryRun {
			// Not a readiness failure: the agent decides, logs and
			// publishes, and deletes nothing.
			defer fmt.Fprintln(w, "dry run: nothing is deleted (--dry-run); each removal is logged as would remove")
		}
		if n := a.deletes.Unsettled(); n > 0 {
			// Not a readiness failure: the delete is settled as soon as
			// containerd answers; nothing else is deleted meanwhile.
			defer fmt.Fprintf(w, "deletes: %d with an outcome containerd has not told yet\n", n)
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range problems {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /plan", a.servePlan)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		doc := StatusDoc{Policy: a.policySettings()}
		a.live.ViewAll(func(states []*projection.State) { doc.Report = projection.NewReport(a.clock.Now(), states...) })
		if a.imageGC != nil {
			st := a.imageGC.Status()
			doc.ImageGC = &st
		}
		if a.containerGC != nil {
			st := a.containerGC.Status()
			doc.ContainerGC = &st
		}
		if a.logs != nil {
			p := a.logs.Status()
			doc.Logs = &p
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(doc)
	})
	return mux
}

// returnListing returns the memory of a full listing to the system once
// the projection applied it (SpacesOptions.AfterRound): at a busy node's
// size a listing is the agent's peak, and the Go runtime would keep those
// pages mapped for minutes. It runs once per listing (ResyncInterval).
func returnListing(log zerolog.Logger) func() {
	return func() {
		debug.FreeOSMemory()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		log.Debug().Uint64("heap_in_use_bytes", m.HeapInuse).Uint64("heap_released_bytes", m.HeapReleased).
			Msg("listing applied: its memory returned")
	}
}

// readyProbeTimeout bounds /readyz's call to containerd.
const readyProbeTimeout = 2 * time.Second

// containerdAnswers reports whether containerd answers a Version call
// within readyProbeTimeout.
func (a *agent) containerdAnswers(ctx context.Context) error {
	if a.version == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
	defer cancel()
	_, err := a.version(ctx)
	return err
}

// clockSaveInterval is how often the agent's time is saved for the next
// start (clock.Continue): any mark of this boot serves, so it can be rare.
const clockSaveInterval = 30 * time.Second

// saveClock saves the agent's clock now, every clockSaveInterval and when
// ctx ends. A failure (full state disk) is logged once per run of
// failures and costs only the continuity of the next start.
func saveClock(ctx context.Context, clk *clock.Clock, path string, log zerolog.Logger) error {
	t := time.NewTicker(clockSaveInterval)
	defer t.Stop()
	failing := false
	for {
		err := clk.Save(path)
		if err != nil && !failing {
			log.Warn().Str("component", "clock").Err(err).Msg("cannot save the agent's time")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			_ = clk.Save(path)
			return nil
		case <-t.C:
		}
	}
}
