package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// KeepList is a fleet keep list a replay is given (`replay --keep-list`,
// `--keep-list-nats`), in the two parts the agent matches: the operator's
// patterns and the cluster's references.
type KeepList struct {
	// Patterns are globs, matched as --keep-image's (gc.KeepCovers).
	Patterns []string
	// Declared are the cluster keep list's exact references, each with
	// who declares it, matched by name (gc.DeclaredMatch).
	Declared map[string]string
	// Sources say where each part came from; Notes what a reader should
	// know of them (a cluster list not complete, lists left out).
	Sources []string
	Notes   []string
}

// Len is how many patterns and references k holds.
func (k KeepList) Len() int { return len(k.Patterns) + len(k.Declared) }

// Add merges o into k: patterns once each, references with o's sources
// where k had none.
func (k *KeepList) Add(o KeepList) {
	for _, p := range o.Patterns {
		if !slices.Contains(k.Patterns, p) {
			k.Patterns = append(k.Patterns, p)
		}
	}
	for ref, by := range o.Declared {
		if k.Declared == nil {
			k.Declared = map[string]string{}
		}
		if _, ok := k.Declared[ref]; !ok {
			k.Declared[ref] = by
		}
	}
	k.Sources = append(k.Sources, o.Sources...)
	k.Notes = append(k.Notes, o.Notes...)
}

// covers reports whether k keeps an image with one of names, as the
// agent's planner matches the fleet keep list.
func (k KeepList) covers(names []string) bool {
	for _, n := range names {
		if len(k.Declared) > 0 {
			if _, _, ok := gc.DeclaredMatch(k.Declared, n); ok {
				return true
			}
		}
		for _, p := range k.Patterns {
			if gc.KeepCovers(p, n) {
				return true
			}
		}
	}
	return false
}

// fleet is k as the planner's fleet keep list, known.
func (k KeepList) fleet() gc.KeepList {
	return gc.KeepList{Input: gc.Input{State: gc.InputKnown}, Patterns: slices.Clone(k.Patterns), Declared: k.Declared}
}

// ParseKeepList reads a keep list file: patterns one per line (blank
// lines and lines starting with # skipped), or the JSON `gcagent ctl keep
// ls --json` prints, of which the all-clusters list, cluster's own and the
// cluster keep list ("declared") count. A pattern that is no glob, a line
// with a blank inside, or a file with nothing to keep is an error naming
// the file and line.
func ParseKeepList(name string, b []byte, cluster string) (KeepList, error) {
	k := KeepList{Sources: []string{"file " + name}}
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		return parseKeepJSON(name, t, cluster)
	}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, " \t") {
			return KeepList{}, fmt.Errorf("%s:%d: %q: one pattern per line (a # starts a comment line)", name, i+1, line)
		}
		if err := gc.ValidKeepPattern(line); err != nil {
			return KeepList{}, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		if !slices.Contains(k.Patterns, line) {
			k.Patterns = append(k.Patterns, line)
		}
	}
	if k.Len() == 0 {
		return KeepList{}, fmt.Errorf("%s holds no pattern: nothing to compare", name)
	}
	return k, nil
}

// parseKeepJSON reads what `gcagent ctl keep ls --json` prints: scope ("*",
// a cluster, "declared") to its list.
func parseKeepJSON(name string, b []byte, cluster string) (KeepList, error) {
	var scopes map[string]json.RawMessage
	if err := json.Unmarshal(b, &scopes); err != nil {
		return KeepList{}, fmt.Errorf("%s: not the JSON of gcagent ctl keep ls --json: %v", name, err)
	}
	k := KeepList{}
	var others []string
	for _, scope := range slices.Sorted(maps.Keys(scopes)) {
		raw := scopes[scope]
		switch scope {
		case "*", cluster:
			var l struct {
				Patterns *[]string `json:"patterns"`
			}
			if err := json.Unmarshal(raw, &l); err != nil || l.Patterns == nil {
				return KeepList{}, fmt.Errorf("%s: list %q: want an object with patterns", name, scope)
			}
			for _, p := range *l.Patterns {
				if err := gc.ValidKeepPattern(p); err != nil {
					return KeepList{}, fmt.Errorf("%s: list %q: %w", name, scope, err)
				}
			}
			what := "the all-clusters list"
			if scope != "*" {
				what = "cluster " + scope + "'s list"
			}
			k.Add(KeepList{Patterns: *l.Patterns, Sources: []string{fmt.Sprintf("%s of file %s (%d patterns)", what, name, len(*l.Patterns))}})
		case "declared":
			var l struct {
				Head    *declared.Head        `json:"head"`
				Missing int                   `json:"missingShards"`
				Images  []declared.ShardImage `json:"images"`
			}
			if err := json.Unmarshal(raw, &l); err != nil {
				return KeepList{}, fmt.Errorf("%s: the cluster keep list: %v", name, err)
			}
			for _, im := range l.Images {
				if im.Ref == "" {
					return KeepList{}, fmt.Errorf("%s: the cluster keep list: an image without ref", name)
				}
			}
			cl := ClusterKeepList(&declared.List{Head: l.Head, Images: l.Images, Missing: l.Missing})
			cl.Sources = []string{fmt.Sprintf("the cluster keep list of file %s (%d references)", name, len(cl.Declared))}
			k.Add(cl)
		default:
			others = append(others, scope)
		}
	}
	if len(others) > 0 {
		k.Notes = append(k.Notes, fmt.Sprintf("the lists of clusters %s in %s are not cluster %s's: left out (--cluster)",
			strings.Join(others, ", "), name, cluster))
	}
	if k.Len() == 0 {
		return KeepList{}, fmt.Errorf("%s holds no pattern for cluster %s: nothing to compare", name, cluster)
	}
	return k, nil
}

// ClusterKeepList is the cluster keep list l (gcagent-cluster's, as
// natsbus.ReadCluster or ctl keep ls read it) as a replay keeps by it:
// every reference it holds, and a note when it is not whole (the agent
// would keep by the last complete list it read, which the replay does
// not know: these references stand for it).
func ClusterKeepList(l *declared.List) KeepList {
	k := KeepList{Declared: map[string]string{}}
	if l == nil {
		return k
	}
	for _, im := range l.Images {
		k.Declared[im.Ref] = l.Sources(im.Ref)
	}
	switch {
	case l.Head == nil:
	case l.Head.State != declared.Complete:
		k.Notes = append(k.Notes, fmt.Sprintf("the cluster keep list is %s (%s): replayed with the %d references it holds", l.Head.State,
			cmpOr(l.Head.Reason, "no reason given"), len(k.Declared)))
	case l.Missing > 0:
		k.Notes = append(k.Notes, fmt.Sprintf("the cluster keep list lacks %d shards of its layout: replayed with the %d references read", l.Missing, len(k.Declared)))
	}
	return k
}

func cmpOr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// KeepResult is a replay with a keep list next to the same replay
// without it: its Result is the replay with the list (Replayed) beside
// what the trace recorded; Without the replay with no fleet keep list.
type KeepResult struct {
	Result
	Without  Outcome         `json:"withoutKeepList"`
	KeepList KeepListSummary `json:"keepList"`
	// Kept are the images of the trace the list keeps, and their re-pulls
	// on each side.
	Kept KeptImages `json:"keptImages"`
	// Saved is what the list saves (without less with) and costs.
	Saved Saving `json:"saved"`
}

// KeepListSummary says what keep list was replayed.
type KeepListSummary struct {
	Patterns   []string `json:"patterns,omitempty"`
	References int      `json:"references"`
	Sources    []string `json:"sources"`
	Notes      []string `json:"notes,omitempty"`
}

// KeptImages are the images the keep list keeps (a name it covers).
type KeptImages struct {
	Images  int     `json:"images"`
	Bytes   int64   `json:"bytes"` // their sizes, as the kubelet counts them
	Without Repulls `json:"withoutKeepList"`
	With    Repulls `json:"withKeepList"`
}

// Repulls count re-pulls.
type Repulls struct {
	Repulls       int           `json:"repulls"`
	RepulledBytes int64         `json:"repulledBytes"`
	RepullTime    time.Duration `json:"repullTimeNs"`
}

// Saving is what the keep list saves, without it less with it (re-pulls,
// their bytes and time: positive is saved), and what it costs, with it
// less without it (mean free space in points, peak usage in points, time
// above the high threshold: negative free space and positive usage are
// its cost).
type Saving struct {
	Repulls        int           `json:"repulls"`
	RepulledBytes  int64         `json:"repulledBytes"`
	RepullTime     time.Duration `json:"repullTimeNs"`
	MeanFreePoints float64       `json:"meanFreePoints"`
	PeakUsage      int           `json:"peakUsagePoints"`
	AboveHigh      time.Duration `json:"aboveHighNs"`
}

// CompareKeep replays recs twice, with keep as the fleet keep list and
// with none (the recorded fleet keep list is replaced in both; the node's
// own --keep-image patterns stay), in parallel. It does no I/O.
func CompareKeep(recs []trace.Record, o Options, keep KeepList) KeepResult {
	base := o.Policy
	if base == nil {
		base = Given(DefaultPolicy(), func(string) bool { return false })
	}
	with, without := o, o
	with.Detail, without.Detail = true, true
	with.Policy = func(rec *trace.Policy) gc.ImagePolicy {
		p := base(rec)
		p.FleetKeep = keep.fleet()
		return p
	}
	without.Policy = func(rec *trace.Policy) gc.ImagePolicy {
		p := base(rec)
		p.FleetKeep = gc.KeepList{Input: gc.Input{State: gc.InputKnown}}
		return p
	}
	var a, b Result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); b = Simulate(recs, without) }()
	a = Simulate(recs, with)
	wg.Wait()

	kept := keptImages(recs, keep)
	res := KeepResult{Result: a, Without: b.Replayed,
		KeepList: KeepListSummary{Patterns: keep.Patterns, References: len(keep.Declared), Sources: keep.Sources, Notes: keep.Notes}}
	res.Kept.Images = len(kept)
	for _, size := range kept {
		res.Kept.Bytes += size
	}
	res.Kept.With = repullsOf(a.Replayed.Deleted, kept, a.PullCost)
	res.Kept.Without = repullsOf(b.Replayed.Deleted, kept, a.PullCost)
	w, wo := a.Replayed, b.Replayed
	res.Saved = Saving{Repulls: wo.Repulls - w.Repulls, RepulledBytes: wo.RepulledBytes - w.RepulledBytes,
		RepullTime: wo.RepullTime - w.RepullTime, MeanFreePoints: w.MeanFree - wo.MeanFree, PeakUsage: w.PeakUsage - wo.PeakUsage,
		AboveHigh: w.AboveHigh - wo.AboveHigh}
	if !o.Detail {
		res.Recorded.Deleted, res.Replayed.Deleted, res.Without.Deleted = nil, nil, nil
	}
	return res
}

// keptImages returns the images of recs the keep list keeps (a name of
// theirs it covers, at any time), with their last size.
func keptImages(recs []trace.Record, keep KeepList) map[key]int64 {
	kept := map[key]int64{}
	seen := map[key][]string{}
	for _, r := range recs {
		if r.Ev != trace.KindImage {
			continue
		}
		k := key{r.NS, r.Digest}
		if _, ok := kept[k]; ok {
			if r.Size > 0 {
				kept[k] = r.Size
			}
			continue
		}
		if slices.Equal(seen[k], r.Names) {
			continue
		}
		seen[k] = r.Names
		if keep.covers(r.Names) {
			kept[k] = r.Size
		}
	}
	return kept
}

// repullsOf counts the re-pulls among deletions of the images in kept.
func repullsOf(dels []Deletion, kept map[key]int64, price PullCost) Repulls {
	var n Repulls
	for _, d := range dels {
		if _, ok := kept[key{d.Namespace, d.Digest}]; ok && !d.Returned.IsZero() {
			n.Repulls++
			n.RepulledBytes += d.Size
			n.RepullTime += price.Of(d.Names, d.Size)
		}
	}
	return n
}
