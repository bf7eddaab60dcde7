package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/rs/zerolog"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
)

// planDoc is what `gcagent plan` prints: one section per kind of GC. Add a
// field per section (containers, logs); printPlan prints each in turn.
type planDoc struct {
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

// planCmd runs `gcagent plan`: a one-shot dry run against the local
// containerd. It takes run's flags (and environment and config file) plus
// --json, lists containerd, and prints what image GC would do now and why.
// It deletes nothing and needs no running agent.
func planCmd(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	rest, asJSON, err := splitJSONFlag(args)
	if err != nil {
		return usageError{err}
	}
	cfg, err := parseRun(rest, env, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "gcagent plan takes the flags of run above, plus --json")
			return err
		}
		return usageError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	doc, err := buildPlan(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	printPlan(stdout, doc)
	return nil
}

// splitJSONFlag takes --json (-json, --json=BOOL) out of args, so that the
// rest parses with run's flag set.
func splitJSONFlag(args []string) ([]string, bool, error) {
	var rest []string
	asJSON := false
	for i, a := range args {
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			rest = append(rest, a)
			continue
		}
		asJSON = true
		if hasVal {
			b, err := strconv.ParseBool(val)
			if err != nil {
				return nil, false, fmt.Errorf("invalid --json %q: %v", val, err)
			}
			asJSON = b
		}
	}
	return rest, asJSON, nil
}

// buildPlan lists containerd and plans against it.
func buildPlan(ctx context.Context, cfg agent.Config) (planDoc, error) {
	// The running agent's time (a wall-clock step since it started does
	// not move it), so that this plan's ages are the agent's.
	clk, _ := clock.Continue(nil, filepath.Join(cfg.StateDir, clock.File))
	doc := planDoc{At: clk.Now(), Containerd: cfg.ContainerdAddress, Namespace: cfg.Namespace, ImageFS: cfg.ImageFS}
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
	fs := node.NewImageFS(cfg.ImageFS, agent.DefaultContainerdRoot, runtimeapi.NewImageServiceClient(conn))
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
	doc.Containers = gc.PlanContainersAcross(states, doc.ContainerPolicy, doc.At, logs.PodLogDirExists(cfg.PodLogDir))
	doc.LogsConfig = cfg.LogsConfig()
	// Kubelet logs belong to CRI's namespace; unmanaged, its state stays
	// empty and unsynced, and the log plan removes nothing.
	if doc.Logs, err = agent.PlanLogs(cfg, criState); err != nil {
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

// printPlan prints the plan for humans, one section per kind.
func printPlan(w io.Writer, doc planDoc) {
	fmt.Fprintf(w, "containerd %s, namespaces %s (--namespace %s), at %s\n", doc.Containerd, strings.Join(doc.Namespaces, ","),
		doc.Namespace, doc.At.Format(time.RFC3339))
	fmt.Fprintf(w, "history: %s", doc.History)
	if doc.HistoryNote != "" {
		fmt.Fprintf(w, " (%s)", doc.HistoryNote)
	}
	fmt.Fprintln(w)
	printImagePlan(w, doc)
	printContainerPlan(w, doc.ContainerPolicy, doc.Containers)
	printLogsPlan(w, doc.LogsConfig, doc.Logs)
}

func printImagePlan(w io.Writer, doc planDoc) {
	p := doc.Images
	fmt.Fprintf(w, "\nIMAGES  filesystem %s: ", doc.ImageFS)
	if p.InvalidCapacity {
		fmt.Fprintln(w, "capacity 0: threshold GC cannot run")
	} else {
		fmt.Fprintf(w, "%d%% used (%s of %s available)\n", p.Usage, humanBytes(int64(p.Disk.AvailableBytes)), humanBytes(int64(p.Disk.CapacityBytes)))
	}
	if p.Triggered {
		fmt.Fprintf(w, "threshold GC: triggered, %s to free; %d image(s) to delete, %s estimated",
			humanBytes(p.AmountToFree), len(p.Delete), humanBytes(p.EstimatedBytes))
		if p.EstimatedBytes < p.AmountToFree {
			fmt.Fprint(w, " (not enough: deleting every eligible image does not reach the low threshold)")
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "threshold GC: not triggered; %d image(s) to delete by max age\n", len(p.Delete))
	}
	if !p.NextAgeOut.IsZero() {
		fmt.Fprintf(w, "next max-age deadline: %s\n", p.NextAgeOut.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "sandbox images: %s\n\n", strings.Join(doc.SandboxImages, ", "))
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		if d := p.Now.Sub(t).Round(time.Second); d > 0 {
			return d.String() + " ago"
		}
		return "now"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DECISION\tREASON\tNAMESPACE\tIMAGE\tDIGEST\tSIZE\tFIRST SEEN\tLAST USED\tDETAIL")
	row := func(decision string, it gc.ImageItem) {
		detail := it.Rule
		switch {
		case len(it.Users) > 0:
			detail = "users " + strings.Join(it.Users, ",")
		case !it.EligibleAt.IsZero():
			detail = "eligible at " + it.EligibleAt.Format(time.RFC3339)
		case it.Name != "" && it.Rule != "":
			detail = it.Name + " ~ " + it.Rule
		case it.Name != "":
			detail = it.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", decision, it.Reason, it.Namespace, strings.Join(it.Names, ","),
			projection.ShortDigest(it.Digest), humanBytes(it.Size), ago(it.FirstSeen), ago(it.LastUsed), detail)
	}
	for _, it := range p.Delete {
		row("delete", it)
	}
	for _, it := range p.Keep {
		row("keep", it)
	}
	tw.Flush()
}
