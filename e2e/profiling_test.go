package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestProfiling: with --profiling the agent serves heap profiles that
// sample allocations (one in every 512 KiB); without it, no profiles are
// served (and allocations are not sampled: cmd/gcagent
// TestSampleAllocations).
func TestProfiling(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		// One agent per containerd (its agent lock): one after the other.
		plain := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "plain"))
		waitSynced(t, plain)
		if code, body, err := plain.GetText("/debug/pprof/heap?debug=1"); err != nil || code != http.StatusNotFound {
			t.Errorf("without --profiling /debug/pprof/heap answered %d (%v):\n%.300s", code, err, body)
		}
		plain.Stop()
		profiled := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "profiled"), "--profiling")
		waitSynced(t, profiled)
		code, body, err := profiled.GetText("/debug/pprof/heap?debug=1")
		header, _, _ := strings.Cut(body, "\n")
		if err != nil || code != http.StatusOK || !strings.HasPrefix(header, "heap profile: ") || !strings.HasSuffix(header, "@ heap/1048576") {
			t.Fatalf("with --profiling /debug/pprof/heap answered %d (%v), header %q; want a heap profile sampled every 512 KiB", code, err, header)
		}
		if strings.HasPrefix(header, "heap profile: 0: 0 [0: 0]") {
			t.Errorf("the heap profile has no samples: %q", header)
		}
	})
}
