package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/rs/zerolog"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Plan is what the agent would do now, as `gcagent plan` prints it: one
// section per kind of GC.
type Plan struct {
	At         time.Time `json:"at"`
	Containerd string    `json:"containerd"`
	// Namespace is --namespace as given; Namespaces the ones planned.
	Namespace  string   `json:"namespace"`
	Namespaces []string `json:"namespaces"`
	ImageFS    string   `json:"imageFS"`
	// History says where first-seen and last-used times come from: "state"
	// (the agent's persisted projection, then a fresh listing on top) or
	// "containerd" (creation times; last use unknown).
	History     string `json:"history"`
	HistoryNote string `json:"historyNote,omitempty"`
	// SandboxImages are the sandbox images in force: the flag, CRI's config,
	// and the images of sandbox containers.
	SandboxImages []string     `json:"sandboxImages"`
	Images        gc.ImagePlan `json:"images"`
	// ContainerPolicy and Containers: what container GC would remove now.
	ContainerPolicy gc.ContainerPolicy `json:"containerPolicy"`
	Containers      gc.ContainerPlan   `json:"containers"`
	// LogsConfig and Logs: what the log cleaner would remove now.
	LogsConfig logs.Config `json:"logsConfig"`
	Logs       logs.Plan   `json:"logs"`
}

// BuildPlan lists containerd and plans against it, deleting nothing:
// `gcagent plan` without a running agent.
func BuildPlan(ctx context.Context, cfg Config) (Plan, error) {
	// The running agent's time (a wall-clock step since it started does
	// not move it), so that this plan's ages are the agent's.
	clk, _ := clock.Continue(nil, filepath.Join(cfg.StateDir, clock.File))
	doc := Plan{At: clk.Now(), Containerd: cfg.ContainerdAddress, Namespace: cfg.Namespace, ImageFS: cfg.ImageFS}
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
	persisted, note := loadHistory(filepath.Join(cfg.StateDir, "state.db"))
	doc.History, doc.HistoryNote = "state", note
	if persisted == nil {
		doc.History = "containerd"
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
			state = fromListing(listing)
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
	doc.Images = gc.PlanImages(states, disk, p, doc.At)
	doc.ContainerPolicy = cfg.ContainerPolicy()
	doc.Containers = gc.PlanContainersAcross(states, doc.ContainerPolicy, doc.At, podKept(cfg.PodLogDir))
	doc.LogsConfig = cfg.LogsConfig()
	// Kubelet logs belong to CRI's namespace; unmanaged, its state stays
	// empty and unsynced, and the log plan removes nothing.
	if doc.Logs, err = PlanLogs(cfg, criState); err != nil {
		return doc, err
	}
	return doc, nil
}

// loadHistory restores the agent's persisted projections (by namespace)
// when the agent is not running; it returns nil when there is none or it
// is locked. A running
// agent holds the store's lock (bbolt allows no reader beside the writer,
// and copying a file being written is not safe), so plan then works from
// containerd's creation times and says so: `gcagent status` and the control
// verb plan give the running agent's own view.
func loadHistory(path string) (map[string]projection.LoadResult, string) {
	if _, err := os.Stat(path); err != nil {
		return nil, "no agent state at " + path + ": first seen is containerd's creation time, last use unknown"
	}
	res, err := projection.ReadStore(path)
	if err != nil {
		return nil, "agent state " + path + " not readable (is the agent running?): " + err.Error() +
			"; first seen is containerd's creation time, last use unknown"
	}
	return res, fmt.Sprintf("agent state %s plus a fresh listing", path)
}

// fromListing builds a projection from a listing alone, each image and
// container first seen when containerd created it.
func fromListing(l events.Listing) *projection.State {
	s := projection.New()
	for _, img := range l.Images {
		if !img.Created.IsZero() && img.Created.Before(l.At) {
			img.At = img.Created
		} else {
			img.At = l.At
		}
		s.Apply(img)
	}
	for _, c := range l.Containers {
		c.At = l.At
		if !c.Created.IsZero() && c.Created.Before(l.At) {
			c.At = c.Created
		}
		s.Apply(c)
	}
	return s
}
