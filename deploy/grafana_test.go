package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestGrafanaDashboard checks the dashboard's shape (its PromQL is checked
// against a real Prometheus in e2e/prometheus_test.go): a Prometheus data
// source variable, a node variable, one row repeated per node, and a panel
// for each topic the issue names.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/gcagent-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Repeat  string `json:"repeat"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" {
		t.Error("no uid: imports would duplicate the dashboard")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["instance"] != "query" {
		t.Errorf("template variables %v: want datasource and instance", vars)
	}
	ids := map[int]bool{}
	var exprs []string
	repeated := false
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" && p.Repeat == "instance" {
			repeated = true
		}
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `instance=~"$instance"`) {
				t.Errorf("panel %q: %q does not filter by the node variable", p.Title, tg.Expr)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	if !repeated {
		t.Error("no row repeated per node (repeat: instance)")
	}
	all := strings.Join(exprs, "\n")
	for topic, needle := range map[string]string{
		"disk usage":             "gcagent_image_gc_disk_usage_ratio",
		"high threshold":         "gcagent_image_gc_high_threshold_ratio",
		"low threshold":          "gcagent_image_gc_low_threshold_ratio",
		"bytes freed":            "gcagent_image_gc_removed_bytes_total",
		"image reaction":         "gcagent_image_gc_reaction_duration_seconds_bucket",
		"container latency":      "gcagent_container_gc_removal_duration_seconds_bucket",
		"log latency":            "gcagent_logs_removal_duration_seconds_bucket",
		"removals by namespace":  "sum by (namespace, reason)",
		"container removals":     "gcagent_container_gc_containers_removed_total",
		"log removals":           "gcagent_logs_removed_total",
		"outbox depth":           "gcagent_natsbus_outbox_depth",
		"estimated and measured": "sum by (measure)",
	} {
		if !strings.Contains(all, needle) {
			t.Errorf("no panel for %s (%s)", topic, needle)
		}
	}
}
