package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/rs/zerolog"
	bolterrors "go.etcd.io/bbolt/errors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Plan is what the agent would do now, as `gcagent plan` prints it: one
// section per kind of GC.
type Plan struct {
	At         time.Time `json:"at"`
	Containerd string    `json:"containerd"`
	// StateDir is the state dir of the agent (or plan) that planned.
	StateDir string `json:"stateDir,omitempty"`
	// Namespace is --namespace as given; Namespaces the ones planned.
	Namespace  string   `json:"namespace"`
	Namespaces []string `json:"namespaces"`
	ImageFS    string   `json:"imageFS"`
	// History says where first-seen and last-used times come from:
	// "agent" (the running agent's own projection: this is its plan),
	// "state" (the agent's persisted projection, then a fresh listing on
	// top) or "none" (no state: a fresh listing seen as the agent's first
	// start sees it, every image and container first seen now).
	History     string `json:"history"`
	HistoryNote string `json:"historyNote,omitempty"`
	// WhatIf names the settings a running agent planned by as they were
	// given (GET /plan?name=value), not as it runs with; their sources in
	// Policy say the agent's own values.
	WhatIf []string `json:"whatIf,omitempty"`
	// Policy is the settings in force and where each came from.
	Policy []Setting `json:"policy"`
	// KubeletNotes warn about the kubelet's config (--kubelet-config): its
	// own image GC still on, eviction thresholds that fire first.
	KubeletNotes []string `json:"kubeletNotes,omitempty"`
	// SandboxImages are the sandbox images in force: the flag, CRI's config,
	// and the images of sandbox containers.
	SandboxImages []string     `json:"sandboxImages"`
	Images        gc.ImagePlan `json:"images"`
	// Next is, when Images falls short because images are too young, the
	// plan of a pass at Images.FirstEligibleAt if the disk stays as it is:
	// which images go then, in order.
	Next *gc.ImagePlan `json:"next,omitempty"`
	// ContainerPolicy and Containers: what container GC would remove now.
	ContainerPolicy gc.ContainerPolicy `json:"containerPolicy"`
	Containers      gc.ContainerPlan   `json:"containers"`
	// LogsConfig and Logs: what the log cleaner would remove now.
	LogsConfig logs.Config `json:"logsConfig"`
	Logs       logs.Plan   `json:"logs"`
	// FailClosed is what the plan keeps only because an input is unknown
	// or stale, by input and kind (none: the agent cleans what the
	// kubelet would).
	FailClosed []FailClosedKept `json:"failClosed"`
}

// BuildPlan lists containerd and plans against it, deleting nothing:
// `gcagent plan` without a running agent.
func BuildPlan(ctx context.Context, cfg Config) (Plan, error) {
	// The running agent's time (a wall-clock step since it started does
	// not move it), so that this plan's ages are the agent's.
	clk, _ := clock.Continue(nil, filepath.Join(cfg.StateDir, clock.File))
	doc := Plan{At: clk.Now(), Containerd: cfg.ContainerdAddress, StateDir: cfg.StateDir, Namespace: cfg.Namespace, ImageFS: cfg.ImageFS, Policy: cfg.Policy()}
	nss, err := cfg.Namespaces()
	if err != nil {
		return doc, err
	}
	cl, err := client.New(cfg.ContainerdAddress, append(node.ClientOpts(), client.WithTimeout(10*time.Second))...)
	if err != nil {
		return doc, fmt.Errorf("containerd at %s: %w", cfg.ContainerdAddress, err)
	}
	defer cl.Close()
	conn, err := node.DialCRI(cfg.ContainerdAddress)
	if err != nil {
		return doc, err
	}
	defer conn.Close()
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	src := node.NewSource(node.Options{Client: cl, CRI: cri, Namespaces: nss, Log: zerolog.Nop(), Now: clk.Now})
	names, err := src.Managed(ctx)
	if err != nil {
		return doc, fmt.Errorf("containerd at %s: %w", cfg.ContainerdAddress, err)
	}
	doc.Namespaces = names
	persisted, note, err := loadHistory(filepath.Join(cfg.StateDir, "state.db"), cfg.MetricsAddress)
	if err != nil {
		return doc, err
	}
	doc.History, doc.HistoryNote = "state", note
	if persisted == nil {
		doc.History = "none"
	}
	var states []*projection.State
	criState := projection.New()
	for _, ns := range names {
		listing, err := src.List(ctx, ns)
		if err != nil {
			return doc, fmt.Errorf("containerd at %s: %w", cfg.ContainerdAddress, err)
		}
		state := persisted[ns].State
		if state == nil {
			// The agent's first start: everything first seen now.
			state = projection.New()
		}
		for _, ev := range projection.Reconcile(state, listing) {
			state.Apply(ev)
		}
		state.Namespace = ns
		states = append(states, state)
		if ns == events.CRINamespace {
			criState = state
		}
	}

	p := cfg.ImagePolicy()
	var s Setting
	p.FleetKeep, s = firstStartKeepList(ctx, cfg, clk.Now)
	doc.Policy = append(doc.Policy, s)
	learned, err := (&node.Runtime{CRI: cri}).SandboxImages(ctx)
	if err != nil {
		doc.HistoryNote = strings.TrimPrefix(doc.HistoryNote+"; sandbox image not learned from CRI: "+err.Error(), "; ")
	}
	p.SandboxImages = gc.SandboxImageSet(p.SandboxImages, learned, gc.SandboxImagesOf(states...))
	doc.SandboxImages = p.SandboxImages
	fs := node.NewImageFS(cfg.ImageFS, DefaultContainerdRoot, runtimeapi.NewImageServiceClient(conn))
	disk, err := fs.Disk()
	doc.ImageFS = fs.Chosen()
	if note := fs.Note(); note != "" {
		doc.HistoryNote = strings.TrimPrefix(doc.HistoryNote+"; "+note, "; ")
	}
	if err != nil {
		return doc, err
	}
	if cfg.Kubelet != nil {
		doc.KubeletNotes = cfg.Kubelet.Notes(cfg.ImageGCHighThreshold, disk.CapacityBytes)
	}
	daemon, _ := cl.Server(ctx) // unknown on an error: the pod log dir's saved evidence is not used
	if err := doc.decide(cfg, states, criState, disk, p, podLogDir(nil, cfg, doc.At), daemon.UUID); err != nil {
		return doc, err
	}
	return doc, showLogs(ctx, cfg, &doc.Containers, &node.Runtime{CRI: cri})
}

// showLogs names in plan, for each CRI container it removes, the log
// files and link that go with it.
func showLogs(ctx context.Context, cfg Config, plan *gc.ContainerPlan, rt *node.Runtime) error {
	if rt == nil || rt.CRI == nil {
		return nil
	}
	files, err := logs.NewContainerLogs(cfg.LogsConfig())
	if err != nil {
		return err
	}
	gc.ShowContainerLogs(ctx, plan, rt, files)
	return nil
}

// decide fills the plan's decisions from the projections: the one code
// both `gcagent plan` and a running agent's /plan go through.
func (doc *Plan) decide(cfg Config, states []*projection.State, criState *projection.State, disk gc.DiskStats, p gc.ImagePolicy, dirs gc.PodLogDir,
	containerd string) error {
	doc.Images = gc.PlanImages(states, disk, p, doc.At)
	if len(doc.Images.Delete) == 0 && !doc.Images.FirstEligibleAt.IsZero() {
		next := gc.PlanImages(states, disk, p, doc.Images.FirstEligibleAt)
		doc.Next = &next
	}
	doc.ContainerPolicy = cfg.ContainerPolicy()
	doc.Containers = gc.PlanContainersAcross(states, doc.ContainerPolicy, doc.At, dirs)
	doc.LogsConfig = cfg.LogsConfig()
	// Kubelet logs belong to CRI's namespace; unmanaged, its state stays
	// empty and unsynced, and the log plan removes nothing.
	var err error
	doc.Logs, err = PlanLogs(cfg, criState, dirs, containerd)
	doc.FailClosed = planKept(doc, p)
	return err
}

// servePlan answers GET /plan with the running agent's own plan: what its
// next passes would do now, from its live projection, measured disk and
// learned sandbox images. Query parameters named after run's flags
// (/plan?image-gc-high-threshold=70) plan by another policy from the same
// history: a what-if that changes nothing in the agent (WithSettings says
// which settings may differ; 400 for the others).
func (a *agent) servePlan(w http.ResponseWriter, r *http.Request) {
	cfg, changed, err := a.cfg.WithSettings(r.URL.Query())
	if err != nil {
		http.Error(w, "what-if: "+err.Error(), http.StatusBadRequest)
		return
	}
	doc := Plan{At: a.clock.Now(), Containerd: cfg.ContainerdAddress, StateDir: cfg.StateDir, Namespace: cfg.Namespace,
		ImageFS: a.imageFS.Chosen(), History: "agent", Policy: a.policyOf(cfg), KubeletNotes: a.kubeletNotes(),
		HistoryNote: fmt.Sprintf("the running agent's own projection (pid %d)", os.Getpid())}
	if !a.live.Synced() {
		doc.HistoryNote += "; not yet synced with containerd"
	}
	disk, err := a.imageFS.Disk()
	if err != nil {
		http.Error(w, "image filesystem not measured: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	p := a.imagePolicy()
	if len(changed) > 0 {
		doc.WhatIf = changed
		doc.HistoryNote += "; what if: " + strings.Join(changed, ", ") + " as given, not the agent's"
		p = whatIfImagePolicy(p, a.cfg, cfg)
	}
	doc.SandboxImages = p.SandboxImages
	a.live.ViewAll(func(states []*projection.State) {
		criState := projection.New()
		for _, s := range states {
			doc.Namespaces = append(doc.Namespaces, s.Namespace)
			if s.Namespace == events.CRINamespace {
				criState = s
			}
		}
		err = doc.decide(cfg, states, criState, disk, p, podLogDir(a.podDirs, cfg, doc.At), a.source.Containerd())
	})
	if err == nil {
		err = showLogs(r.Context(), cfg, &doc.Containers, a.runtime)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(doc)
}

// whatIfImagePolicy is the live image policy p (with the sandbox images
// learned and the fleet keep list) with the settings of cfg in place of
// those of the agent's own config was. A what-if sandbox image is kept
// besides those learned.
func whatIfImagePolicy(p gc.ImagePolicy, was, cfg Config) gc.ImagePolicy {
	np := cfg.ImagePolicy()
	p.HighThresholdPercent, p.LowThresholdPercent = np.HighThresholdPercent, np.LowThresholdPercent
	p.MinAge, p.MaxAge, p.KeepPatterns = np.MinAge, np.MaxAge, np.KeepPatterns
	if cfg.SandboxImage != was.SandboxImage && cfg.SandboxImage != "" && !slices.Contains(p.SandboxImages, cfg.SandboxImage) {
		p.SandboxImages = append(slices.Clone(p.SandboxImages), cfg.SandboxImage)
	}
	return p
}

// loadHistory restores the agent's persisted projections (by namespace)
// when the agent is not running; it returns nil when there is none. A
// running agent holds the store's lock (bbolt allows no reader beside the
// writer): then plan must ask that agent, and says how, rather than plan
// from another history than the agent's.
func loadHistory(path, metricsAddress string) (map[string]projection.LoadResult, string, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, "no agent state at " + path + ": every image and container first seen now, as on the agent's first start", nil
	}
	res, err := projection.ReadStore(path)
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, "", fmt.Errorf("agent state %s is held by a running agent that does not answer on http://%s/plan: give plan that agent's --metrics-address", path, metricsAddress)
	}
	if err != nil {
		// The agent too starts afresh from a state it cannot read.
		return nil, "agent state " + path + " not readable (" + err.Error() + "): every image and container first seen now, as on the agent's first start", nil
	}
	return res, fmt.Sprintf("agent state %s plus a fresh listing", path), nil
}

// firstStartKeepList is the fleet keep list an agent starting now on cfg
// would plan with, as `gcagent plan` without a running agent tells it:
// the list the agent saved; without one, what NATS gives (the embedded
// server, which run starts and creates the bucket on, gives none); when
// NATS does not answer, a list never read, which the agent would wait for
// (--keep-list-wait).
func firstStartKeepList(ctx context.Context, cfg Config, now func() time.Time) (gc.KeepList, Setting) {
	k := loadFleetKeep(cfg.StateDir, cfg.Cluster, keepSource(cfg), cfg.KeepListWait, now, zerolog.Nop())
	l := k.KeepList()
	s := k.Setting(now())
	file := filepath.Join(cfg.StateDir, KeepListFile)
	if l.State != gc.InputUnknown {
		s.Source = "file " + file + ", " + strings.TrimPrefix(s.Source, "nats bucket "+natsbus.KeepBucket+", ")
		return l, s
	}
	if cfg.NATSURL == "" {
		s.Source = "none saved in " + file + "; the embedded server run starts holds none yet"
		return gc.KeepList{Input: gc.KnownInput(now())}, s
	}
	o := cfg.ConnOptions()
	o.FailFast = true
	nc, err := natsbus.Connect(o)
	var patterns []string
	if err == nil {
		defer nc.Close()
		patterns, err = readKeepList(ctx, cfg, nc)
	}
	switch {
	case err == nil:
		s.Value, s.Source = strings.Join(patterns, ","), "nats bucket "+natsbus.KeepBucket+", read now (none saved in "+file+")"
		return gc.KeepList{Input: gc.KnownInput(now()), Patterns: patterns}, s
	case natsbus.KeepWatchCause(err) == natsbus.KeepCauseBucketNotFound:
		s.Source = "nats: no bucket " + natsbus.KeepBucket + " (none saved in " + file + ")"
		return gc.KeepList{Input: gc.KnownInput(now())}, s
	}
	l.Cause = natsbus.KeepWatchCause(err) + ": " + err.Error()
	s.Source = "never read: none saved in " + file + ", NATS does not give it (" + l.Cause + "): an agent starting now waits for it up to --keep-list-wait"
	return l, s
}
