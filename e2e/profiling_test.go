package e2e

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestProfiling: with --profiling the agent serves heap profiles that
// sample allocations (one in every 512 KiB); without it, no profiles are
// served (and allocations are not sampled: cmd/gcagent
// TestSampleAllocations).
func TestProfiling(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		plain := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "plain"))
		profiled := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "profiled"), "--profiling")
		waitSynced(t, plain)
		waitSynced(t, profiled)
		if code, body := getText(t, plain, "/debug/pprof/heap?debug=1"); code != http.StatusNotFound {
			t.Errorf("without --profiling /debug/pprof/heap answered %d:\n%.300s", code, body)
		}
		code, body := getText(t, profiled, "/debug/pprof/heap?debug=1")
		header, _, _ := strings.Cut(body, "\n")
		if code != http.StatusOK || !strings.HasPrefix(header, "heap profile: ") || !strings.HasSuffix(header, "@ heap/1048576") {
			t.Fatalf("with --profiling /debug/pprof/heap answered %d, header %q; want a heap profile sampled every 512 KiB", code, header)
		}
		if strings.HasPrefix(header, "heap profile: 0: 0 [0: 0]") {
			t.Errorf("the heap profile has no samples: %q", header)
		}
	})
}

// getText fetches path from the agent's HTTP server as text.
func getText(t *testing.T, a *testenv.Agent, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
