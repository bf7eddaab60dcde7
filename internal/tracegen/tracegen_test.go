package tracegen

import (
	"testing"
	"time"

	"github.com/gcagent/gcagent/trace"
)

// TestGenerate: the trace holds the images and runs asked for, in time
// order, from a full node, and its image GC keeps the disk between the
// thresholds.
func TestGenerate(t *testing.T) {
	p := Params{Days: 3, Images: 600, Runs: 20000, Capacity: 300 << 30, Other: 30 << 30, Warmup: 24 * time.Hour}
	recs := Generate(p)
	counts := map[trace.Kind]int{}
	digests := map[string]bool{}
	peak := 0
	for i, r := range recs {
		counts[r.Ev]++
		if r.Digest != "" {
			digests[r.Digest] = true
		}
		if i > 0 && r.T.Before(recs[i-1].T) {
			t.Fatalf("record %d at %s before the previous one", i, r.T)
		}
		if r.Ev == trace.KindDisk {
			peak = max(peak, r.Disk.Usage())
		}
	}
	t.Logf("%d records: %v; %d images; peak %d%%", len(recs), counts, len(digests), peak)
	if counts[trace.KindUse] < 1000 || counts[trace.KindRemoved] == 0 || counts[trace.KindImage] < 100 {
		t.Errorf("too little happened: %v", counts)
	}
	if peak < 85 || peak > 90 {
		t.Errorf("peak usage %d%%: image GC should keep it near 85%%", peak)
	}
}
