package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
)

// metricDeclRE finds the metric names the agent's code declares: in
// prometheus.*Opts{Name: ...}, NewDesc(...) and the ops collector's d(...).
var metricDeclRE = regexp.MustCompile(`(?:Name:\s*|NewDesc\(|\bd\()"(gcagent_[a-z_]+)"`)

// declaredMetrics lists every metric family the module's non-test Go
// files declare.
func declaredMetrics(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "deploy" || d.Name() == "kubeletdiff") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range metricDeclRE.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// onlyWhen are the families that exist only under a condition this test
// does not set up, each with the condition.
var onlyWhen = map[string]string{
	"gcagent_kubelet_image_gc_enabled": "--kubelet-config is given and its file was read",
}

// TestMetricFamiliesBeforeFirstEvent: on a quiet node (no image, no
// container, nothing deleted) every metric family the agent declares is
// exported, counters and histograms at zero with their known label values,
// so dashboards show 0 rather than "No data" and increase() sees the first
// removal; and the page passes `promtool check metrics`. At 7485972 eleven
// families (images, containers and logs removed, events received, regret
// among them) were absent until their first increment.
func TestMetricFamiliesBeforeFirstEvent(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	testenv.Require(t, err == nil, "promtool (Debian package prometheus)")
	root := testenv.RepoRoot(t)
	decl := declaredMetrics(t, root)
	if len(decl) < 40 {
		t.Fatalf("found only %d declared metric families: the pattern no longer matches the code", len(decl))
	}
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v})
			a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"))
			natsWaitSynced(t, a)
			text, err := metricsText(a)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range decl {
				if _, ok := onlyWhen[name]; ok {
					continue
				}
				if !strings.Contains(text, "\n# TYPE "+name+" ") {
					t.Errorf("%s is not exported before the first event", name)
				}
			}
			for _, zero := range []string{
				`gcagent_image_gc_images_removed_total{namespace="k8s.io",reason="space"} 0`,
				`gcagent_container_gc_containers_removed_total{kind="container",namespace="k8s.io",reason="per-unit-cap"} 0`,
				`gcagent_logs_removed_total{kind="symlink",reason="container-exited"} 0`,
				`gcagent_image_gc_regret_total{namespace="k8s.io"} 0`,
				`gcagent_events_received_total{topic="/tasks/exit"} 0`,
			} {
				if !strings.Contains(text, "\n"+zero+"\n") {
					t.Errorf("no zero series %s", zero)
				}
			}
			lint := exec.Command(promtool, "check", "metrics")
			lint.Stdin = strings.NewReader(text)
			if out, err := lint.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("promtool check metrics: %v\n%s", err, out)
			}
		})
	}
}
