package deploy

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestPrometheusRules runs promtool on the alerting rules of the agent and
// of the cluster component: they parse, and their unit tests
// (gcagent-rules_test.yaml, gcagent-cluster-rules_test.yaml: each alert
// fires when it should and stays silent when it should not) pass.
func TestPrometheusRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	testenv.Require(t, err == nil, "promtool (Debian package prometheus)")
	for _, args := range [][]string{
		{"check", "rules", "gcagent-rules.yaml"},
		{"test", "rules", "gcagent-rules_test.yaml"},
		{"check", "rules", "gcagent-cluster-rules.yaml"},
		{"test", "rules", "gcagent-cluster-rules_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
