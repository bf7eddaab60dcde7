package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
)

// controlHandler answers NATS control requests from the running agent.
type controlHandler struct{ a *agent }

var _ natsbus.Handler = controlHandler{}

// NewControl returns the control handler of an agent that reads live with
// cfg and runs no GC component (for tools and tests): status, plan and
// explain answer from live, gc is refused.
func NewControl(cfg Config, live *projection.Spaces) natsbus.Handler {
	a := &agent{cfg: cfg, live: live, imageFS: node.NewImageFS(cfg.ImageFS, "", nil)}
	return controlHandler{a}
}

// runControl answers control requests on the agent's NATS connection until
// ctx ends. gc requests run only with --allow-remote-gc.
func (a *agent) runControl(ctx context.Context) error {
	return natsbus.ServeControl(ctx, a.bus.nc, controlHandler{a}, natsbus.ControlOptions{
		Cluster: a.cfg.Cluster, Node: a.cfg.NodeName, AllowRemoteGC: a.cfg.AllowRemoteGC, Logger: a.log,
	})
}

// ControlStatus is the data of a status reply: the heartbeat's figures and
// what the node is configured to do.
type ControlStatus struct {
	Heartbeat
	Node          string    `json:"node"`
	Cluster       string    `json:"cluster"`
	Version       string    `json:"version"`
	Now           time.Time `json:"now"`
	Pods          int       `json:"pods"`
	DeadContainer int       `json:"deadContainers"`
	Seq           uint64    `json:"seq"`
	DryRun        bool      `json:"dryRun"`
	AllowRemoteGC bool      `json:"allowRemoteGC"`
}

// Status summarizes the projection, the disk and the outbox.
func (h controlHandler) Status(context.Context) (any, error) {
	a := h.a
	now := time.Now().UTC()
	st := ControlStatus{Heartbeat: a.heartbeat(now, a.bus), Node: a.cfg.NodeName, Cluster: a.cfg.Cluster,
		Version: version.Version, Now: now, DryRun: a.cfg.DryRun, AllowRemoteGC: a.cfg.AllowRemoteGC}
	a.live.View(func(s *projection.State) {
		st.Pods += len(s.Pods)
		st.Seq += s.Seq
		for _, c := range s.Containers {
			if c.Dead() {
				st.DeadContainer++
			}
		}
	})
	return st, nil
}

// ControlPlan is the data of a plan reply: what a GC pass would do now.
type ControlPlan struct {
	Synced bool `json:"synced"`
	// DryRun says the agent runs with --dry-run: it deletes none of these.
	DryRun     bool             `json:"dryRun,omitempty"`
	Images     gc.ImagePlan     `json:"images"`
	Containers gc.ContainerPlan `json:"containers"`
}

// plan computes both plans from one snapshot of the projection.
func (h controlHandler) plan() (ControlPlan, error) {
	a := h.a
	disk, err := a.imageFS.Disk()
	if err != nil {
		return ControlPlan{}, err
	}
	now := a.clock.Now()
	var p ControlPlan
	p.Synced, p.DryRun = a.live.Synced(), a.cfg.DryRun
	a.live.ViewAll(func(states []*projection.State) {
		p.Images = gc.PlanImages(states, disk, a.imagePolicy(), now)
		p.Containers = gc.PlanContainersAcross(states, a.cfg.ContainerPolicy(), now, podLogDir(a.podDirs, a.cfg, now))
	})
	return p, nil
}

// Plan returns the dry-run plan, with the log files each CRI container's
// removal removes; it deletes nothing.
func (h controlHandler) Plan(ctx context.Context) (any, error) {
	p, err := h.plan()
	if err == nil {
		err = showLogs(ctx, h.a.cfg, &p.Containers, h.a.runtime)
	}
	return p, err
}

// ControlExplanation is the data of an explain reply.
type ControlExplanation struct {
	Query    string       `json:"query"`
	Decision string       `json:"decision"` // delete or keep
	Why      string       `json:"why"`
	Image    gc.ImageItem `json:"image"`
	Usage    int          `json:"usage"`
	High     int          `json:"highThreshold"`
	Low      int          `json:"lowThreshold"`
	Synced   bool         `json:"synced"`
}

// Explain says why the image named query (a name, a digest or a digest
// prefix of at least 12 hex digits) is kept or would go now.
func (h controlHandler) Explain(_ context.Context, query string) (any, error) {
	p, err := h.plan()
	if err != nil {
		return nil, err
	}
	// The first namespace (sorted) that knows the image answers.
	var ns, digest string
	err = fmt.Errorf("image %q is %w", query, errImageUnknown)
	h.a.live.View(func(s *projection.State) {
		if digest != "" {
			return
		}
		if d, ferr := findImage(s, query); ferr == nil {
			ns, digest, err = s.Namespace, d, nil
		} else if !errors.Is(ferr, errImageUnknown) {
			err = ferr
		}
	})
	if digest == "" {
		return nil, natsbus.RequesterError(err) // a typo is not the agent's error
	}
	ex := ControlExplanation{Query: query, Usage: p.Images.Usage, High: h.a.cfg.ImageGCHighThreshold,
		Low: h.a.cfg.ImageGCLowThreshold, Synced: p.Synced}
	found := false
	for _, list := range []struct {
		decision string
		items    []gc.ImageItem
	}{{"delete", p.Images.Delete}, {"keep", p.Images.Keep}} {
		for _, it := range list.items {
			if it.Digest == digest && it.Namespace == ns {
				ex.Decision, ex.Image, found = list.decision, it, true
			}
		}
	}
	if !found { // the plan lists every image; the projection moved between the two reads
		return nil, fmt.Errorf("image %q changed while planning; ask again", query)
	}
	ex.Why = explainImage(ex.Image, p.Images, h.a.cfg)
	if !p.Synced {
		ex.Why += " (the agent has not listed containerd yet: nothing is deleted before it has)"
	}
	return ex, nil
}

// errImageUnknown: no image of a namespace matches the query.
var errImageUnknown = errors.New("not known to this node")

// findImage returns the digest of the one image matching query: a name
// as stored or in the short form keep patterns match too (app:1 for
// docker.io/library/app:1, gc.FamiliarName), or a digest or its prefix.
func findImage(s *projection.State, query string) (string, error) {
	q := strings.TrimSpace(query)
	if _, ok := s.Images[q]; ok {
		return q, nil
	}
	fq := gc.FamiliarName(q)
	var hits, named []string
	for _, d := range slices.Sorted(maps.Keys(s.Images)) {
		img := s.Images[d]
		if _, ok := img.Names.Labels(q); ok {
			return d, nil
		}
		for _, n := range img.Names {
			if gc.FamiliarName(n.Name) == fq {
				named = append(named, d)
				break
			}
		}
		hex := strings.TrimPrefix(q, "sha256:")
		if len(hex) >= 12 && strings.HasPrefix(strings.TrimPrefix(d, "sha256:"), hex) {
			hits = append(hits, d)
		}
	}
	if len(named) > 0 {
		hits = named // a name is no digest prefix
	}
	switch len(hits) {
	case 0:
		return "", fmt.Errorf("image %q is %w", query, errImageUnknown)
	case 1:
		return hits[0], nil
	}
	return "", fmt.Errorf("image %q is ambiguous: %s", query, strings.Join(hits, ", "))
}

// explainImage says in one sentence why the plan decided as it did.
func explainImage(it gc.ImageItem, p gc.ImagePlan, cfg Config) string {
	switch it.Reason {
	case gc.ReasonInUse, gc.ReasonInUseByID, gc.ReasonInUseBySnap, gc.ReasonImageVolume:
		return fmt.Sprintf("kept: used by %d container(s): %s", len(it.Users), strings.Join(it.Users, ", "))
	case gc.ReasonPinned:
		return fmt.Sprintf("kept: %s is pinned (io.cri-containerd.pinned=pinned)", it.Name)
	case gc.ReasonSandboxImage:
		return fmt.Sprintf("kept: %s is the sandbox image %s", it.Name, it.Rule)
	case gc.ReasonKeepPattern:
		if pattern, ok := strings.CutPrefix(it.Rule, gc.FleetRule("")); ok {
			return fmt.Sprintf("kept: %s matches the fleet keep list's %s", it.Name, pattern)
		}
		return fmt.Sprintf("kept: %s matches --keep-image %s", it.Name, it.Rule)
	case gc.ReasonKeepListUnread:
		return fmt.Sprintf("kept for now: the fleet keep list was never read from NATS and could name it; image deletes wait for it until %s (--keep-list-wait %s)",
			it.EligibleAt.Format(time.RFC3339), cfg.KeepListWait)
	case gc.ReasonTooYoung:
		return fmt.Sprintf("kept: first seen %s, younger than --minimum-image-ttl-duration %s; eligible at %s",
			it.FirstSeen.Format(time.RFC3339), cfg.MinimumImageTTL, it.EligibleAt.Format(time.RFC3339))
	case gc.ReasonNotNeeded:
		if !p.Triggered {
			return fmt.Sprintf("kept for now: eligible, but disk usage %d%% is below --image-gc-high-threshold %d%%",
				p.Usage, cfg.ImageGCHighThreshold)
		}
		return fmt.Sprintf("kept for now: eligible, but deleting less recently used images frees the %d bytes needed to reach %d%%",
			p.AmountToFree, cfg.ImageGCLowThreshold)
	case gc.ReasonMaxAge:
		return fmt.Sprintf("would be deleted: unused since %s, longer than --image-maximum-gc-age %s",
			lastUsedText(it), cfg.ImageMaximumGCAge)
	case gc.ReasonSpace:
		return fmt.Sprintf("would be deleted: disk usage %d%% reached --image-gc-high-threshold %d%% and it is among the least recently used (last used %s)",
			p.Usage, cfg.ImageGCHighThreshold, lastUsedText(it))
	}
	return string(it.Reason)
}

func lastUsedText(it gc.ImageItem) string {
	if it.LastUsed.IsZero() {
		return "never (first seen " + it.FirstSeen.Format(time.RFC3339) + ")"
	}
	return it.LastUsed.Format(time.RFC3339)
}

// errNoGCNow is the reply to a gc request while no image GC component is wired in.
var errNoGCNow = errors.New("this agent cannot run an image GC pass on request (no image GC component)")

// GC runs an image GC pass now through the image GC component. The
// natsbus layer has already refused it unless --allow-remote-gc is set.
func (h controlHandler) GC(ctx context.Context) (any, error) {
	if h.a.runGCNow == nil {
		return nil, errNoGCNow
	}
	return h.a.runGCNow(ctx)
}
