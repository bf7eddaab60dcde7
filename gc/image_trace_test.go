package gc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
)

// fakeTracer records what image GC gives the usage trace.
type fakeTracer struct {
	mu       sync.Mutex
	disks    []string // trigger of each measurement ("" for a sample)
	policies []ImagePolicy
}

var _ imageTracer = (*fakeTracer)(nil)

func (f *fakeTracer) TraceDisk(_ time.Time, _ DiskStats, trigger string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disks = append(f.disks, trigger)
}

func (f *fakeTracer) TracePolicy(_ time.Time, p ImagePolicy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policies = append(f.policies, p)
}

// TestImageGCTraces: a pass gives the trace its policy and the disk it
// planned with, under its trigger; Run gives the policy at its start and
// every disk sample.
func TestImageGCTraces(t *testing.T) {
	tr := &fakeTracer{}
	g, _, _, _ := newImageGC(t, newNode(), policy8070, func(c *imageGCConfig) { c.Trace = tr })
	g.Pass(context.Background(), "manual")
	if len(tr.disks) != 1 || tr.disks[0] != "manual" || len(tr.policies) != 1 ||
		tr.policies[0].HighThresholdPercent != policy8070.HighThresholdPercent {
		t.Fatalf("after a pass: disks %q, policies %+v", tr.disks, tr.policies)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = g.Run(ctx); close(done) }()
	wait.For(t, 30*time.Second, func() string {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		samples := 0
		for _, d := range tr.disks {
			if d == "" {
				samples++
			}
		}
		if len(tr.policies) < 2 || samples < 1 {
			return fmt.Sprintf("Run gave %d policies and %d samples", len(tr.policies), samples)
		}
		return ""
	})
	cancel()
	<-done
}
