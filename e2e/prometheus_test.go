package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/gcagent/gcagent/internal/testenv"
	"sigs.k8s.io/yaml"
)

// promQuery runs an instant query against Prometheus's HTTP API and
// returns the number of series or samples in the result, or the error
// Prometheus reported.
func promQuery(t *testing.T, addr, q string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/query?query="+url.QueryEscape(q), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	if r.Data.ResultType == "scalar" {
		return 1, nil
	}
	var res []json.RawMessage
	if err := json.Unmarshal(r.Data.Result, &res); err != nil {
		return 0, err
	}
	return len(res), nil
}

// dashboardExprs returns every PromQL expression of the Grafana dashboard
// (panels, rows' panels, template variables), with Grafana's variables
// replaced as Grafana would for "all nodes".
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	r := strings.NewReplacer(`$instance`, `.*`, `$__rate_interval`, `30s`, `$__range`, `1h`, `$__interval`, `5s`)
	var out []string
	for _, p := range d.Panels {
		if len(p.Panels) > 0 {
			t.Fatalf("panel %q: collapsed rows are not read by this test", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, r.Replace(tg.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		// label_values(metric, label) is Grafana's; its PromQL is the metric.
		if m := regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`).FindStringSubmatch(q); m != nil {
			out = append(out, m[1])
		} else {
			t.Fatalf("template variable query %q not understood", q)
		}
	}
	return out
}

// ruleExprs returns the alert name and expression of every rule.
func ruleExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// declared reports whether a non-test Go file of the module holds the
// quoted metric name.
func declared(t *testing.T, root, name string) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || found {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), `"`+name+`"`) {
			found = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

var metricNameRE = regexp.MustCompile(`\bgcagent_[a-z_]+\b`)

// TestPrometheusScrapesAgent: a real Prometheus (Debian's) scrapes a running
// agent that has just deleted an image under pressure, pruned a dead
// container and removed a dangling log link, and loads the alerting rules.
// The agent's /metrics passes `promtool check metrics`; every metric the
// rules and the dashboard name exists; every rule evaluates without error;
// every dashboard expression returns data.
func TestPrometheusScrapesAgent(t *testing.T) {
	t.Parallel()
	promBin, err1 := exec.LookPath("prometheus")
	promtool, err2 := exec.LookPath("promtool")
	testenv.Require(t, err1 == nil && err2 == nil, "prometheus and promtool (Debian package prometheus)")
	root := testenv.RepoRoot(t)
	rulesPath := filepath.Join(root, "deploy/prometheus/gcagent-rules.yaml")
	dashPath := filepath.Join(root, "deploy/grafana/gcagent-dashboard.json")
	v := testenv.Versions()[0]
	c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})

	// A workload sized to the measured disk, as in TestChartOnKubelet's chartCollects.
	c.Import(t, testenv.Runnable("example.test/job:1"))
	job := c.CreateNative(t, "dead-job", "example.test/job:1", "sh", "-c", "exit 1")
	u0 := usagePercent(t, c.Root)
	const victim = "example.test/victim:1"
	c.Import(t, testenv.Image{Name: victim, Layers: []testenv.Layer{{Seed: "victim-prom", Size: 16 << 20}}})
	u1 := usagePercent(t, c.Root)
	if u1-u0 < 4 {
		t.Fatalf("the victim image moved usage only from %d%% to %d%%", u0, u1)
	}
	a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"),
		"--image-gc-high-threshold="+strconv.Itoa(u1), "--image-gc-low-threshold="+strconv.Itoa((u0+u1)/2),
		"--minimum-image-ttl-duration=0s", "--uncollected-exit-grace=1s", "--pod-log-grace=1s")
	natsWaitSynced(t, a)
	task, err := job.NewTask(c.Ctx(), cio.NullIO)
	if err == nil {
		err = task.Start(c.Ctx())
	}
	if err != nil {
		t.Fatalf("start dead-job: %v", err)
	}
	link := danglingLog(t, c, "ghost", "fedcba9876543210")
	testenv.Eventually(t, 30*time.Second, func() string {
		switch {
		case !imageGone(t, c, victim):
			return "victim image not removed"
		case !containerGone(t, c, "dead-job"):
			return "dead-job not pruned"
		case exists(link):
			return "dangling link not removed"
		}
		return ""
	})

	text, err := metricsText(a)
	if err != nil {
		t.Fatal(err)
	}
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = strings.NewReader(text)
	if out, err := lint.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	rules := ruleExprs(t, rulesPath)
	dash := dashboardExprs(t, dashPath)
	for _, expr := range append(slices.Collect(func(yield func(string) bool) {
		for _, e := range rules {
			if !yield(e) {
				return
			}
		}
	}), dash...) {
		for _, name := range metricNameRE.FindAllString(expr, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			// A labelled metric has no series before its first sample
			// (image.skipped did not happen here): then its name must at
			// least be declared in the agent's source, so a typo fails.
			if !strings.Contains(text, "\n# TYPE "+base+" ") && !declared(t, root, base) {
				t.Errorf("%s (in %q) is neither exported by the agent nor declared in its source", name, expr)
			}
		}
	}

	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: gcagent
    static_configs:
      - targets: [%q]
`, rulesPath, a.Addr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := testenv.FreeAddr(t)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("prometheus log tail:\n%s", strings.Join(lines[max(0, len(lines)-20):], "\n"))
		}
	})
	// Enough scrapes for rate() over the dashboard's window: five samples.
	testenv.Eventually(t, 60*time.Second, func() string {
		n, err := promQuery(t, promAddr, `count_over_time(gcagent_build_info[30s]) >= 5`)
		if err != nil || n == 0 {
			return fmt.Sprintf("prometheus has not scraped the agent 5 times yet (%d %v)", n, err)
		}
		return ""
	})
	if n, err := promQuery(t, promAddr, `up{job="gcagent"} == 1`); err != nil || n != 1 {
		t.Fatalf("target not up: %d %v", n, err)
	}

	// The rules as Prometheus loaded and evaluated them.
	testenv.Eventually(t, 30*time.Second, func() string {
		resp, err := http.Get("http://" + promAddr + "/api/v1/rules")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name           string    `json:"name"`
						Health         string    `json:"health"`
						LastError      string    `json:"lastError"`
						LastEvaluation time.Time `json:"lastEvaluation"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return err.Error()
		}
		seen := map[string]bool{}
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				if rule.LastEvaluation.IsZero() || rule.LastEvaluation.Year() < 2000 {
					return rule.Name + " not evaluated yet"
				}
				if rule.Health != "ok" || rule.LastError != "" {
					t.Fatalf("rule %s: health %s: %s", rule.Name, rule.Health, rule.LastError)
				}
				seen[rule.Name] = true
			}
		}
		for name := range rules {
			if !seen[name] {
				return "rule " + name + " not loaded"
			}
		}
		return ""
	})
	for name, expr := range rules {
		if _, err := promQuery(t, promAddr, expr); err != nil {
			t.Errorf("rule %s: %v", name, err)
		}
	}
	empty := 0
	for _, expr := range dash {
		n, err := promQuery(t, promAddr, expr)
		switch {
		case err != nil:
			t.Errorf("dashboard query %q: %v", expr, err)
		case n == 0:
			empty++
			t.Errorf("dashboard query %q returns no data", expr)
		}
	}
	t.Logf("containerd %s: %d rules evaluated without error, %d dashboard queries returned data", v, len(rules), len(dash)-empty)
}
