package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// CommandOptions are `gcagent replay`'s.
type CommandOptions struct {
	// Source is the trace: --trace FILE, else the agent at
	// --metrics-address, else --state-dir's state file.
	Source trace.Source
	// Policy is Options.Policy (Given: run's flags given change the
	// recorded policy).
	Policy func(*trace.Policy) gc.ImagePolicy
	// LowGiven says --image-gc-low-threshold was given: a sweep of the
	// high threshold keeps it instead of moving it along.
	LowGiven bool
	Order    string // lru (default), gdsf or gdsf-bytes
	Sweep    string // FLAG=A..B[:STEP]; empty: one replay
	JSON     bool
	Detail   bool // list every deletion (with --json)
	// PullCost prices re-pulls in time (zero: DefaultPullCost).
	PullCost PullCost
	// KeepList, when set, is replayed as the fleet keep list beside the
	// same replay without one (CompareKeep).
	KeepList *KeepList
}

// Validate checks the options that need no trace: one line naming the
// flag.
func (o CommandOptions) Validate() error {
	switch o.Order {
	case "", OrderLRU, OrderGDSF, OrderGDSFBytes:
	default:
		return fmt.Errorf("invalid --order %q: must be %s, %s or %s", o.Order, OrderLRU, OrderGDSF, OrderGDSFBytes)
	}
	if o.Sweep != "" {
		if _, err := ParseSweep(o.Sweep); err != nil {
			return err
		}
	}
	if err := o.PullCost.orDefault().Validate(); err != nil {
		return err
	}
	if k := o.KeepList; k != nil {
		switch {
		case o.Sweep != "":
			return fmt.Errorf("--sweep and a keep list: one at a time (a sweep compares values of a flag, a keep list its replay without it)")
		case k.Len() == 0:
			return fmt.Errorf("the keep list (%s) holds no pattern: nothing to compare", strings.Join(k.Sources, ", "))
		}
	}
	return nil
}

// Command runs `gcagent replay`: it reads the trace, replays it (once,
// or once per value of the sweep) and prints the outcome next to what
// happened, as text or JSON. Lines of a trace file that are not records
// are counted, said on stderr, and skipped; so is what a stored trace
// held that could not be read (its header's Skipped).
func Command(ctx context.Context, o CommandOptions, stdout, stderr io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	bad := 0
	o.Source.Bad = func(line int, err error) {
		if bad++; bad <= 3 {
			fmt.Fprintf(stderr, "gcagent: trace line %d skipped: %v\n", line, err)
		}
	}
	header, recs, from, err := trace.Fetch(ctx, o.Source)
	if err != nil {
		return fmt.Errorf("read the trace: %w", err)
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "gcagent: %d trace lines skipped (not records)\n", bad)
	}
	if sk := header.Skipped; sk != nil && sk.Any() {
		fmt.Fprintf(stderr, "gcagent: the trace from %s: %s\n", from, sk)
	}
	if len(recs) == 0 {
		return fmt.Errorf("the trace from %s holds no record", from)
	}
	opts := Options{Policy: o.Policy, Order: o.Order, Detail: o.Detail, PullCost: o.PullCost}
	start := time.Now()
	if o.KeepList != nil {
		res := CompareKeep(recs, opts, *o.KeepList)
		if o.JSON {
			return writeJSON(stdout, res)
		}
		printKeep(stdout, header, res, o.LowGiven, time.Since(start))
		return nil
	}
	if o.Sweep != "" {
		sw, _ := ParseSweep(o.Sweep)
		res := RunSweep(recs, opts, sw, o.LowGiven)
		if o.JSON {
			return writeJSON(stdout, res)
		}
		printSweep(stdout, header, res, o.LowGiven, time.Since(start))
		return nil
	}
	res := Simulate(recs, opts)
	if o.JSON {
		return writeJSON(stdout, res)
	}
	printResult(stdout, header, res, o.LowGiven, time.Since(start))
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// window describes the trace's extent for people.
func window(header trace.Record, from, to time.Time, records, images int) string {
	node := ""
	if header.Node != "" {
		node = "node " + header.Node + ", "
	}
	return fmt.Sprintf("%s%s .. %s (%s), %d records, %d images", node, from.UTC().Format(time.RFC3339),
		to.UTC().Format(time.RFC3339), roundDur(to.Sub(from)), records, images)
}

// describe writes a policy for people.
func describe(p trace.Policy) string {
	maxAge := "off"
	if p.MaxAge > 0 {
		maxAge = time.Duration(p.MaxAge).String()
	}
	s := fmt.Sprintf("high %d%%, low %d%%, minimum age %s, maximum age %s, order %s", p.High, p.Low,
		time.Duration(p.MinAge), maxAge, cmpOrder(p.Order))
	switch p.Order {
	case OrderGDSF:
		s += " (a re-pull priced in time)"
	case OrderGDSFBytes:
		s += " (a re-pull priced in bytes)"
	}
	if len(p.KeepPatterns) > 0 {
		s += ", keep " + strings.Join(p.KeepPatterns, ",")
	}
	if len(p.SandboxImages) > 0 {
		s += ", sandbox " + strings.Join(p.SandboxImages, ",")
	}
	return s
}

// dryRunNote says that the agent ran as a dry run for d of the trace; ""
// for none.
func dryRunNote(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf("note: the agent ran as a dry run over %s of this trace (its first record to its last) and deleted nothing then; the replay deletes there as its policy says, so recorded and replayed differ there even with the recorded policy\n", roundDur(d))
}

// printHead writes the trace, the policy replayed and the notes on it.
func printHead(w io.Writer, header trace.Record, res Result, lowGiven bool) {
	fmt.Fprintf(w, "trace: %s, disk %s\n", window(header, res.From, res.To, res.Records, res.Images), gc.HumanBytes(int64(res.Capacity)))
	fmt.Fprintf(w, "replayed: %s\n", describe(res.Policy))
	if rec := res.RecordedPolicy; rec != nil && !lowGiven && res.Policy.Low != rec.Low {
		fmt.Fprintf(w, "note: the recorded low threshold %d%% exceeds the high threshold %d%%: replayed with %d%%, the same distance below (--image-gc-low-threshold sets it)\n",
			rec.Low, res.Policy.High, res.Policy.Low)
	}
	fmt.Fprint(w, dryRunNote(res.DryRun))
}

// outcomeRows writes the rows of outcomes side by side under titles.
func outcomeRows(w io.Writer, titles []string, outs ...Outcome) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	row := func(name string, f func(o Outcome) string) {
		fmt.Fprint(tw, name)
		for _, o := range outs {
			fmt.Fprintf(tw, "\t%s", f(o))
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "\t%s\n", strings.Join(titles, "\t"))
	row("deletions", func(o Outcome) string { return fmt.Sprint(o.Deletions) })
	row("  bytes", func(o Outcome) string { return gc.HumanBytes(o.DeletedBytes) })
	row("re-pulls", func(o Outcome) string { return fmt.Sprint(o.Repulls) })
	row("  bytes", func(o Outcome) string { return gc.HumanBytes(o.RepulledBytes) })
	row("  pull time (est.)", func(o Outcome) string { return roundDur(o.RepullTime) })
	row("  median time away", func(o Outcome) string { return roundDur(o.MedianReturn) })
	row("time above high", func(o Outcome) string { return roundDur(o.AboveHigh) })
	row("peak usage", func(o Outcome) string { return fmt.Sprintf("%d%%", o.PeakUsage) })
	row("mean free", func(o Outcome) string { return fmt.Sprintf("%.1f%%", o.MeanFree) })
	row("passes that deleted", func(o Outcome) string { return fmt.Sprint(o.Passes) })
	tw.Flush()
}

// printFoot writes how footprints and pull times were estimated.
func printFoot(w io.Writer, res Result, took time.Duration) {
	fmt.Fprintf(w, "\nfootprint: a delete frees %.2f times the image's size (measured over the recorded deletions)\n", res.FootprintRatio)
	fmt.Fprintf(w, "pull time: %s a re-pull (--pull-fixed-cost, --pull-throughput, --pull-near: the trace cannot measure it)\n", res.PullCost)
	fmt.Fprintf(w, "replayed in %s\n", took.Round(time.Millisecond))
}

func printResult(w io.Writer, header trace.Record, res Result, lowGiven bool, took time.Duration) {
	printHead(w, header, res, lowGiven)
	fmt.Fprintln(w)
	outcomeRows(w, []string{"recorded", "replayed"}, res.Recorded, res.Replayed)
	printFoot(w, res, took)
}

// printKeep writes a replay with a keep list beside the same replay
// without one, and what the list saves and costs.
func printKeep(w io.Writer, header trace.Record, res KeepResult, lowGiven bool, took time.Duration) {
	printHead(w, header, res.Result, lowGiven)
	k := res.KeepList
	fmt.Fprintf(w, "keep list: %d patterns and %d references from %s, as the fleet keep list (replacing the recorded one; without it: none)\n",
		len(k.Patterns), k.References, strings.Join(k.Sources, "; "))
	for _, n := range k.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	kept := res.Kept
	fmt.Fprintf(w, "it keeps %d of the trace's %d images (%s)\n", kept.Images, res.Images, gc.HumanBytes(kept.Bytes))
	fmt.Fprintln(w)
	outcomeRows(w, []string{"recorded", "without keep list", "with keep list"}, res.Recorded, res.Without, res.Replayed)
	s := res.Saved
	repulls := func(r Repulls) string {
		return fmt.Sprintf("%d re-pulls (%s, %s)", r.Repulls, gc.HumanBytes(r.RepulledBytes), roundDur(r.RepullTime))
	}
	others := func(o Outcome, k Repulls) Repulls {
		return Repulls{o.Repulls - k.Repulls, o.RepulledBytes - k.RepulledBytes, o.RepullTime - k.RepullTime}
	}
	fmt.Fprintf(w, "\nsaved: %d re-pulls, %s, %s of pulls in all\n", s.Repulls, gc.HumanBytes(s.RepulledBytes), roundSigned(s.RepullTime))
	fmt.Fprintf(w, "  the kept images: %s without the list, %s with it\n", repulls(kept.Without), repulls(kept.With))
	fmt.Fprintf(w, "  the others: %s without the list, %s with it\n", repulls(others(res.Without, kept.Without)),
		repulls(others(res.Replayed, kept.With)))
	fmt.Fprintf(w, "cost: mean free %.1f%% -> %.1f%% (%+.1f points), peak usage %d%% -> %d%%, time above high %s -> %s\n",
		res.Without.MeanFree, res.Replayed.MeanFree, s.MeanFreePoints, res.Without.PeakUsage, res.Replayed.PeakUsage,
		roundDur(res.Without.AboveHigh), roundDur(res.Replayed.AboveHigh))
	printFoot(w, res.Result, took)
}

// roundSigned is roundDur for a difference, which may be negative.
func roundSigned(d time.Duration) string {
	if d < 0 {
		return "-" + roundDur(-d)
	}
	return roundDur(d)
}

func printSweep(w io.Writer, header trace.Record, res SweepResult, lowGiven bool, took time.Duration) {
	fmt.Fprintf(w, "trace: %s\n", window(header, res.From, res.To, res.Records, res.Images))
	fmt.Fprintf(w, "sweep: %s, order %s; recorded: %d re-pulls, %s, %.1f%% free on average\n", res.Flag, res.Order,
		res.Recorded.Repulls, gc.HumanBytes(res.Recorded.RepulledBytes), res.Recorded.MeanFree)
	if res.Flag == FlagHigh && !lowGiven {
		fmt.Fprintln(w, "the low threshold stays as recorded, or, where it would exceed the high one, follows it down at the same distance (--image-gc-low-threshold sets it)")
	}
	fmt.Fprint(w, dryRunNote(res.DryRun))
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "high\tlow\tmin age\tmax age\tmean free\tpeak\tre-pulls\tre-pulled\tdeletions\tabove high\tfrontier\t")
	var invalid []string
	for _, p := range res.Points {
		if p.Error != "" {
			// The value in its own column, the reason after the table.
			cols := []string{"-", "-", "-", "-"}
			cols[sweptColumn(res.Flag)] = p.Value
			if res.Flag == FlagHigh || res.Flag == FlagLow {
				cols[sweptColumn(res.Flag)] += "%"
			}
			fmt.Fprintf(tw, "%s\tinvalid\t\t\t\t\t\t\n", strings.Join(cols, "\t"))
			invalid = append(invalid, fmt.Sprintf("  %s=%s: %s\n", res.Flag, p.Value, p.Error))
			continue
		}
		o, maxAge := p.Replayed, "off"
		if p.Policy.MaxAge > 0 {
			maxAge = time.Duration(p.Policy.MaxAge).String()
		}
		front := ""
		if p.Frontier {
			front = "*"
		}
		fmt.Fprintf(tw, "%d%%\t%d%%\t%s\t%s\t%.1f%%\t%d%%\t%d\t%s\t%d\t%s\t%s\t\n", p.Policy.High, p.Policy.Low,
			time.Duration(p.Policy.MinAge), maxAge, o.MeanFree, o.PeakUsage, o.Repulls, gc.HumanBytes(o.RepulledBytes),
			o.Deletions, roundDur(o.AboveHigh), front)
	}
	tw.Flush()
	if len(invalid) > 0 {
		fmt.Fprintf(w, "\ninvalid, not replayed:\n%s", strings.Join(invalid, ""))
	}
	fmt.Fprintf(w, "\n* on the frontier: no other point keeps more free and re-pulls fewer bytes\n")
	fmt.Fprintf(w, "%d replays in %s\n", len(res.Points), took.Round(time.Millisecond))
}

// sweptColumn is the column of the sweep table the swept flag is in.
func sweptColumn(flag string) int {
	return map[string]int{FlagHigh: 0, FlagLow: 1, FlagMinAge: 2, FlagMaxAge: 3}[flag]
}

// roundDur writes d to a precision a person reads: 7h31m, 2m5s, 350ms.
func roundDur(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}
