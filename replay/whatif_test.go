package replay

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// TestGivenHighAloneMovesTheRecordedLow: `replay --image-gc-high-threshold=70`
// over a trace that recorded 85/80 replays 70/65, as each row of a sweep of
// the high threshold does, and says so; 90 keeps the recorded 80.
func TestGivenHighAloneMovesTheRecordedLow(t *testing.T) {
	high := func(n int) func(*trace.Policy) gc.ImagePolicy {
		return Given(gc.ImagePolicy{HighThresholdPercent: n, LowThresholdPercent: 80}, func(f string) bool { return f == FlagHigh })
	}
	rec := &trace.Policy{High: 85, Low: 80}
	for _, tc := range []struct{ high, low int }{{70, 65}, {90, 80}} {
		if p := high(tc.high)(rec); p.HighThresholdPercent != tc.high || p.LowThresholdPercent != tc.low {
			t.Errorf("high %d alone: replays %d/%d, want %d/%d", tc.high, p.HighThresholdPercent, p.LowThresholdPercent, tc.high, tc.low)
		}
		sw, _ := ParseSweep(FlagHigh + "=" + itoa(tc.high) + ".." + itoa(tc.high))
		if p, err := sw.set(PolicyOf(*rec), sw.Values[0], false); err != nil || p.LowThresholdPercent != tc.low {
			t.Errorf("sweep row %d: low %d (%v), want %d as the single replay", tc.high, p.LowThresholdPercent, err, tc.low)
		}
	}

	path := writeTrace(t, fourImages().disk(time.Minute, 1000, 50, "").recs, "")
	var out, errOut bytes.Buffer
	err := Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, Policy: high(70)}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"high 70%, low 65%", "the recorded low threshold 80% exceeds the high threshold 70%: replayed with 65%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestReplaySaysTheDryRun: a trace whose agent ran as a dry run recorded no
// deletion there, while the replay deletes by the same policy: the output
// says how long, so that the difference is not taken for the replay's.
func TestReplaySaysTheDryRun(t *testing.T) {
	b := &tb{}
	b.add(trace.Record{T: at(0), Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80, DryRun: true}})
	b.image(0, "a", 100).image(time.Second, "b", 100)
	b.disk(time.Minute, 1000, 50, "")
	b.add(trace.Record{T: at(time.Hour), Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80}})
	b.disk(2*time.Hour, 1000, 50, "")
	res := b.run(Options{})
	if res.DryRun != time.Hour || res.Recorded.Deletions != 0 || res.Replayed.Deletions == 0 {
		t.Errorf("dry run %s, recorded %d, replayed %d deletions; want 1h, none, some", res.DryRun, res.Recorded.Deletions, res.Replayed.Deletions)
	}
	// An agent that stopped and started again as a run: the dry run ended
	// with its last record, not at the next start.
	b2 := &tb{}
	b2.add(trace.Record{T: at(0), Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80, DryRun: true}})
	b2.disk(10*time.Minute, 1000, 50, "")
	b2.add(trace.Record{T: at(time.Hour), Ev: trace.KindStart})
	b2.add(trace.Record{T: at(time.Hour), Ev: trace.KindPolicy, Policy: &trace.Policy{High: 85, Low: 80}})
	if res := b2.run(Options{}); res.DryRun != 10*time.Minute {
		t.Errorf("dry run then a start: %s, want 10m (to its last record)", res.DryRun)
	}
	path := writeTrace(t, b.recs, "")
	for _, sweep := range []string{"", FlagHigh + "=80..90:10"} {
		var out, errOut bytes.Buffer
		if err := Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, Sweep: sweep}, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		if want := "the agent ran as a dry run over 1h0m0s of this trace (its first record to its last) and deleted nothing then"; !strings.Contains(out.String(), want) {
			t.Errorf("sweep %q: output lacks %q:\n%s", sweep, want, out.String())
		}
	}
}

// TestSweepInvalidRowsInTheirColumn: a row the policy refuses shows its
// value under the swept flag's column, and the reason after the table.
func TestSweepInvalidRowsInTheirColumn(t *testing.T) {
	path := writeTrace(t, fourImages().disk(time.Minute, 1000, 50, "").recs, "")
	var out, errOut bytes.Buffer
	err := Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, Sweep: FlagLow + "=80..90:10"}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	var row []string
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "90%" {
			row = f
		}
	}
	if len(row) < 5 || row[0] != "-" || row[4] != "invalid" {
		t.Errorf("invalid row %q, want the value under low and invalid after the policy:\n%s", row, out.String())
	}
	if !strings.Contains(out.String(), "invalid, not replayed:\n  "+FlagLow+"=90: ") {
		t.Errorf("the reason is not listed after the table:\n%s", out.String())
	}
}
