package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
)

// TestPrintPlanOrder: the plan numbers what goes in the order it goes,
// images and containers alike, marks what stays with -, names the rule of
// the order, and says when it is a what-if of a running agent.
func TestPrintPlanOrder(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	img := func(name string, reason gc.Reason) gc.ImageItem {
		return gc.ImageItem{Namespace: "k8s.io", Digest: "sha256:" + strings.Repeat(name[:1], 64), Names: []string{name}, Size: 1 << 20,
			FirstSeen: t0.Add(-time.Hour), Reason: reason}
	}
	doc := agent.Plan{At: t0, History: "agent", WhatIf: []string{"image-gc-high-threshold"},
		Policy: []agent.Setting{{Name: "image-gc-high-threshold", Value: "70%", Source: "what-if; the agent's: 85% (default)"}},
		Images: gc.ImagePlan{Now: t0, Triggered: true,
			Delete: []gc.ImageItem{img("old:1", gc.ReasonMaxAge), img("lru:1", gc.ReasonSpace), img("next:1", gc.ReasonSpace)},
			Keep:   []gc.ImageItem{img("used:1", gc.ReasonInUse)}},
		Containers: gc.ContainerPlan{Remove: []gc.ContainerItem{{Namespace: "k8s.io", ID: "c1"}, {Namespace: "k8s.io", ID: "s1"}}},
	}
	var out strings.Builder
	printPlan(&out, doc)
	text := out.String()
	for _, re := range []string{
		`WHAT IF: planned with image-gc-high-threshold as given here`,
		`image-gc-high-threshold\s+70%\s+what-if; the agent's: 85% \(default\)`,
		`deleted in ORDER: images past --image-maximum-gc-age first, then for space the least recently used first`,
		`(?s)\n1\s+delete\s+max-age\s+k8s.io\s+old:1.*\n2\s+delete\s+space\s+k8s.io\s+lru:1.*\n3\s+delete\s+space\s+k8s.io\s+next:1.*\n-\s+keep\s+in-use\s+k8s.io\s+used:1`,
		`(?s)removed in ORDER: .*\n1\s+remove\s.*c1.*\n2\s+remove\s.*s1`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("plan lacks %s:\n%s", re, text)
		}
	}
}

// TestPlansSayDryRun: the plan of an agent that runs with --dry-run, and
// ctl plan's reply from one, say that it deletes none of it (d7dd547
// printed "2 to remove" as for a run).
func TestPlansSayDryRun(t *testing.T) {
	doc := agent.Plan{History: "agent", Policy: []agent.Setting{{Name: "dry-run", Value: "true", Source: "flag"}}}
	var out strings.Builder
	printPlan(&out, doc)
	if !strings.Contains(out.String(), "DRY RUN: the agent deletes nothing (--dry-run)") {
		t.Errorf("plan of a dry-run agent:\n%s", out.String())
	}
	out.Reset()
	data, _ := json.Marshal(agent.ControlPlan{Synced: true, DryRun: true,
		Containers: gc.ContainerPlan{Remove: []gc.ContainerItem{{Namespace: "k8s.io", ID: "c1"}, {Namespace: "k8s.io", ID: "c2"}}}})
	if err := printPlanReply(&out, "n1", data); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "2 to remove") || !strings.Contains(out.String(), "dry run (--dry-run): the agent deletes none of them") {
		t.Errorf("ctl plan of a dry-run agent:\n%s", out.String())
	}
}
