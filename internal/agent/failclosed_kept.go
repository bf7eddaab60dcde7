package agent

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/projection"
)

// What is kept now only because an input is unknown or stale (invariant
// 7): counted by input and kind, so that an operator can tell cleaning
// from over-keeping. The same counts are in plan, /status (through the
// plan) and the gauge gcagent_fail_closed_kept.

// The inputs that can keep something, and the kinds of things they keep.
const (
	inputKeepList   = "keep-list"   // the fleet keep list (operator's and cluster's): never read, or stale
	inputPodLogDir  = "pod-log-dir" // the pod log dir: not verified, missing, a target out of view, change times unread
	inputProjection = "projection"  // containerd's listing: not synced yet
)

var (
	keptInputs = []string{inputKeepList, inputPodLogDir, inputProjection}
	keptKinds  = []string{"image", "container", "link", "dir"}
)

// FailClosedKept is one count of what is kept only because an input is
// not known.
type FailClosedKept struct {
	Input string `json:"input"`
	Kind  string `json:"kind"`
	Count int    `json:"count"`
	// Why names the state or reason (unknown, stale, or the log
	// cleaner's reason).
	Why string `json:"why"`
}

// keptCounts adds up what the three planners keep for an input's sake:
// images a keep list never read holds (unread) or a stale one keeps
// (stale), the containers of stopped pods no deleted-pod sign can judge,
// and the links and dirs the log cleaner keeps for an input
// (logs.InputReasons).
func keptCounts(unread, stale, containers int, lp logs.Plan) []FailClosedKept {
	var out []FailClosedKept
	add := func(input, kind, why string, n int) {
		if n > 0 {
			out = append(out, FailClosedKept{Input: input, Kind: kind, Count: n, Why: why})
		}
	}
	add(inputKeepList, "image", "unknown", unread)
	add(inputKeepList, "image", "stale", stale)
	add(inputPodLogDir, "container", "unknown", containers)
	for kind, reasons := range lp.KeptForInputs() {
		k := "link"
		if kind == logs.KindPodDir {
			k = "dir"
		}
		for r, n := range reasons {
			input := inputPodLogDir
			if r == logs.ReasonNotSynced {
				input = inputProjection
			}
			add(input, k, string(r), n)
		}
	}
	slices.SortFunc(out, func(a, b FailClosedKept) int {
		return strings.Compare(a.Input+a.Kind+a.Why, b.Input+b.Kind+b.Why)
	})
	return out
}

// planKept is keptCounts of a plan's own parts.
func planKept(doc *Plan, p gc.ImagePolicy) []FailClosedKept {
	unread, stale := 0, 0
	for _, it := range doc.Images.Keep {
		switch {
		case it.Reason == gc.ReasonKeepListUnread:
			unread++
		case it.Reason == gc.ReasonKeepPattern && p.FleetKeep.State == gc.InputStale &&
			(strings.HasPrefix(it.Rule, gc.FleetRule("")) || strings.HasPrefix(it.Rule, gc.DeclaredRule("", ""))):
			stale++
		}
	}
	return keptCounts(unread, stale, doc.Containers.KeptUnjudged, doc.Logs)
}

var descFailClosedKept = prometheus.NewDesc("gcagent_fail_closed_kept",
	"What is kept now only because an input is unknown or stale (the fleet keep list, the pod log dir, containerd's listing), by input and kind (image, container, link, dir): 0 when the agent cleans all the kubelet would.",
	[]string{"input", "kind"}, nil)

// failClosedMetrics exports gcagent_fail_closed_kept at scrape time: the
// images from the projection now (as heartbeats compute what is
// reclaimable), the containers and log entries from their last passes.
type failClosedMetrics struct{ a *agent }

func (m failClosedMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- descFailClosedKept }

func (m failClosedMetrics) Collect(ch chan<- prometheus.Metric) {
	counts := map[[2]string]int{}
	for _, c := range m.a.failClosedKept() {
		counts[[2]string{c.Input, c.Kind}] += c.Count
	}
	for _, in := range keptInputs {
		for _, k := range keptKinds {
			ch <- prometheus.MustNewConstMetric(descFailClosedKept, prometheus.GaugeValue, float64(counts[[2]string{in, k}]), in, k)
		}
	}
}

// failClosedKept counts what the agent keeps now only for an input's
// sake.
func (a *agent) failClosedKept() []FailClosedKept {
	unread, stale, containers := 0, 0, 0
	if a.imageGC != nil && a.live != nil {
		p := a.imageGC.Policy()
		now := a.clock.Now()
		a.live.ViewAll(func(states []*projection.State) { unread, stale = gc.KeptForInputs(states, p, now) })
	}
	if a.containerGC != nil {
		containers = a.containerGC.Status().Plan.KeptUnjudged
	}
	var lp logs.Plan
	if a.logs != nil {
		lp = a.logs.Status()
	}
	return keptCounts(unread, stale, containers, lp)
}
