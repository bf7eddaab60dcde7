package tracegen

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/declared"
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

// TestGenerateDeclared: the declared workloads run as they say (a
// CronJob every hour, a scale-to-zero workload once a day from about
// 08:00 to 20:00, a rollback's v1 idle between its rollout and its return
// to it), their keep list names exactly their images, normalized, and the
// busy mix beside them is the same as without them.
func TestGenerateDeclared(t *testing.T) {
	p := Params{Days: 3, Images: 600, Runs: 20000, Capacity: 300 << 30, Other: 30 << 30, Warmup: 24 * time.Hour,
		Declared: Workloads{CronJobs: 3, ScaleToZero: 2, Rollbacks: 2}}
	recs := Generate(p)
	keep := KeepList(p)
	if len(keep) != 3+2+2*2 {
		t.Fatalf("keep list of %d images, want 9", len(keep))
	}
	byName := map[string]string{} // name -> digest
	for _, r := range recs {
		for _, n := range r.Names {
			byName[n] = r.Digest
		}
	}
	uses := map[string][]trace.Record{} // digest -> its use and idle records
	for _, r := range recs {
		if r.Ev == trace.KindUse || r.Ev == trace.KindIdle {
			uses[r.Digest] = append(uses[r.Digest], r)
		}
	}
	for _, e := range keep {
		if n, err := declared.Normalize(e.Image); err != nil || n != e.Image || len(e.By) != 1 {
			t.Errorf("%s: normalized %q (%v), by %v", e.Image, n, err, e.By)
		}
		d, ok := byName[e.Image]
		if !ok {
			t.Errorf("%s: not in the trace", e.Image)
			continue
		}
		var starts []time.Time
		for _, r := range uses[d] {
			if r.Ev == trace.KindUse {
				starts = append(starts, r.T)
			}
		}
		switch kind := e.By[0].Kind + "/" + e.By[0].Namespace; {
		case kind == "CronJob/batch":
			if len(starts) < 3*24-1 {
				t.Errorf("%s: %d runs over 3 days, want one an hour", e.Image, len(starts))
			}
		case kind == "Deployment/office":
			if len(starts) != 3 {
				t.Errorf("%s: %d runs over 3 days, want one a day", e.Image, len(starts))
			}
			for _, s := range starts {
				if h := s.Sub(s.Truncate(24 * time.Hour)); h < 7*time.Hour+30*time.Minute || h > 8*time.Hour+30*time.Minute {
					t.Errorf("%s: starts at %s", e.Image, s)
				}
			}
		case strings.HasSuffix(e.Image, ":v1"): // a rollback's old version
			if len(starts) != 1 || len(uses[d]) != 2 || uses[d][0].Ev != trace.KindIdle {
				t.Errorf("%s: %v, want idle at the rollout, in use again at the rollback", e.Image, uses[d])
			}
		default: // v2
			if len(starts) != 1 || len(uses[d]) != 2 {
				t.Errorf("%s: %v, want used from the rollout to the rollback", e.Image, uses[d])
			}
		}
	}
	// The busy mix's runs are the same without the declared workloads.
	p.Declared = Workloads{}
	busy := func(recs []trace.Record) []trace.Record {
		var out []trace.Record
		for _, r := range recs {
			if (r.Ev == trace.KindUse || r.Ev == trace.KindIdle) && !slices.ContainsFunc(keep, func(e declared.Entry) bool { return byName[e.Image] == r.Digest }) {
				out = append(out, r)
			}
		}
		return out
	}
	a, b := busy(recs), busy(Generate(p))
	if len(a) != len(b) || !slices.EqualFunc(a, b, func(x, y trace.Record) bool { return x.T.Equal(y.T) && x.Digest == y.Digest && x.Ev == y.Ev }) {
		t.Errorf("the busy mix differs with the declared workloads: %d and %d use records", len(a), len(b))
	}
}
