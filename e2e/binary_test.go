package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestShippedBinaryLeavesOutTracing: the binary in the image `make image`
// builds, and the one the tests run, are built with grpcnotrace and hold
// none of golang.org/x/net/trace and html/template. Those parse templates
// when the process starts, and a reflect method lookup reachable from the
// binary keeps every exported method of every type: 6 MiB more, resident
// on every node. The tests' binary has the crash hooks and the call
// timeout hook (-tags testhooks), the shipped one must not.
func TestShippedBinaryLeavesOutTracing(t *testing.T) {
	t.Parallel()
	testenv.AgentImage(t) // make image: writes bin/gcagent-static
	shipped := filepath.Join(testenv.RepoRoot(t), "bin", "gcagent-static")
	for _, bin := range []string{shipped, testenv.AgentBinary(t)} {
		out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v\n%s", bin, err, out)
		}
		if !strings.Contains(string(out), "-tags="+testenv.ShippedTags) {
			t.Errorf("%s was not built with %s:\n%s", bin, testenv.ShippedTags, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, pkg := range []string{"golang.org/x/net/trace.", "html/template."} {
			if bytes.Contains(b, []byte(pkg)) {
				t.Errorf("%s (%.1f MiB) holds code of %s", bin, float64(len(b))/(1<<20), strings.TrimSuffix(pkg, "."))
			}
		}
		// The crash and call timeout hooks are the tests' alone: never in
		// what ships.
		for _, hook := range []string{"GCAGENT_TEST_KILL_AFTER_DELETE", testenv.CallTimeoutEnv} {
			if hooks := bytes.Contains(b, []byte(hook)); hooks != (bin != shipped) {
				t.Errorf("%s: test hook %s built in %v, want %v", bin, hook, hooks, bin != shipped)
			}
		}
		t.Logf("%s: %.1f MiB", bin, float64(len(b))/(1<<20))
	}
}
