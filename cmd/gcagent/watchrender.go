package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/gcagent/gcagent/fleet"
	"github.com/gcagent/gcagent/natsbus"
)

// view is what the table shows of a fleet.
type view struct {
	top  int // nodes that need a look, at most
	rows int // rows of the node table, at most (0: every node)
	// from is when the actions counted start (--since before watch began
	// to tail them), since the --since given; zero while not tailing.
	from  time.Time
	since time.Duration
}

var defaultView = view{top: 20, rows: 50}

// renderFleet prints the fleet as of now with the default view.
func renderFleet(w io.Writer, f *fleet.Fleet, now time.Time, url string, bad int) {
	renderView(w, f, now, url, bad, defaultView)
}

// renderView prints the totals, the nodes that need a look first (worst
// first, at most v.top), the node table (those nodes first, at most
// v.rows) and the tail of f as of now.
func renderView(w io.Writer, f *fleet.Fleet, now time.Time, url string, bad int, v view) {
	rows := f.Rows(now)
	looks := fleet.Looks(rows)
	fmt.Fprintf(w, "gcagent fleet  %s  %s  nodes: %d", now.Format(time.TimeOnly), natsbus.RedactURL(url), len(rows))
	if bad > 0 {
		fmt.Fprintf(w, "  undecodable messages: %d", bad)
	}
	fmt.Fprintf(w, "\n%s\n\n", fleet.Sum(rows, looks))
	if len(looks) > 0 {
		fmt.Fprintf(w, "NEEDS A LOOK (%d nodes, worst first)\n", len(looks))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for i, l := range looks {
			if i == v.top {
				fmt.Fprintf(tw, "... %d more\n", len(looks)-v.top)
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", forTerminal(l.Cluster), forTerminal(l.Node), strings.Join(l.Reasons, ","))
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	// The table: the nodes that need a look first, then the others.
	first := make(map[string]bool, len(looks))
	ordered := make([]fleet.Row, 0, len(rows))
	for _, l := range looks {
		first[l.Cluster+"/"+l.Node] = true
		ordered = append(ordered, l.Row)
	}
	for _, r := range rows {
		if !first[r.Cluster+"/"+r.Node] {
			ordered = append(ordered, r)
		}
	}
	if v.rows > 0 && len(ordered) > v.rows {
		defer fmt.Fprintf(w, "... %d more nodes (--rows 0 shows all, --node and --cluster filter, --json for scripts)\n", len(ordered)-v.rows)
		ordered = ordered[:v.rows]
	}
	renderRows(w, ordered, now, v)
	renderRegrets(w, f)
	renderTail(w, f)
}

// renderRegrets prints the regret rate per cluster (images deleted that
// came back within the regret window, per image removal seen) and the
// images regretted most: whether the thresholds fit.
func renderRegrets(w io.Writer, f *fleet.Fleet) {
	clusters := f.ClusterRegrets()
	if !slices.ContainsFunc(clusters, func(c fleet.ClusterRegrets) bool { return c.Regrets > 0 }) {
		return
	}
	fmt.Fprintln(w, "\nREGRET (deleted images that came back)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range clusters {
		fmt.Fprintf(tw, "%s\t%d of %d removals\t%.1f%%\t%s\n", forTerminal(c.Cluster), c.Regrets, c.Removed, 100*c.Rate, humanBytes(c.Bytes))
	}
	for _, it := range f.TopRegretted(5) {
		fmt.Fprintf(tw, "  %s\t%d times\t\t%s\n", forTerminal(it.Image), it.Regrets, humanBytes(it.Bytes))
	}
	tw.Flush()
}

// renderRows prints the node table and what its counting columns count:
// the actions seen, which start --since before watch began to tail them.
func renderRows(w io.Writer, rows []fleet.Row, now time.Time, v view) {
	removed := "REMOVED"
	if !v.from.IsZero() {
		removed += " SINCE " + v.from.Format(time.TimeOnly)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "CLUSTER\tNODE\tDISK\tIMAGES\tLAST GC\tFREED 1H (MEASURED)\tFAILURES 1H\t%s (img/ctr/log)\tOUTBOX\tHEARTBEAT\n", removed)
	defer func() {
		seen := "the actions seen"
		if !v.from.IsZero() {
			seen += fmt.Sprintf(" since %s (--since %s before watch started)", v.from.Format(time.TimeOnly), v.since)
		}
		fmt.Fprintf(w, "counted of %s: FREED 1H and FAILURES 1H in the last hour, REMOVED all\n", seen)
	}()
	for _, r := range rows {
		disk, images, hb, last := "?", "?", "never", "never"
		if r.DiskUsagePercent >= 0 {
			disk = fmt.Sprintf("%d%%", r.DiskUsagePercent)
		}
		if r.Images >= 0 {
			images = fmt.Sprint(r.Images)
		}
		switch {
		case r.Starting:
			hb = "starting" // no heartbeat yet since the agent started
		case r.HeartbeatAge >= 0:
			hb = r.HeartbeatAge.Round(time.Second).String() + " ago"
		}
		if !r.LastGC.IsZero() {
			last = now.Sub(r.LastGC).Round(time.Second).String() + " ago"
			if r.LastGCResult == "failed" {
				last += " (failed)"
			}
		}
		outbox := fmt.Sprint(r.Outbox)
		if r.OutboxGrowing {
			outbox += "+"
		}
		if r.NATSMode != "" && r.NATSMode != natsbus.ModeJetStream {
			outbox += " (" + forTerminal(r.NATSMode) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%s\t%s\n", forTerminal(r.Cluster), forTerminal(r.Node), disk, images, last,
			humanBytes(r.FreedLastHour), r.FailuresLastHour, r.Removed["image"], r.Removed["container"], r.Removed["log"], outbox, hb)
	}
	tw.Flush()
}

func renderTail(w io.Writer, f *fleet.Fleet) {
	tail := f.Tail()
	if len(tail) == 0 {
		return
	}
	fmt.Fprintln(w, "\nRECENT ACTIONS")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range tail {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.At.Local().Format(time.TimeOnly),
			forTerminal(l.Node), forTerminal(l.Type), forTerminal(l.Subject), forTerminal(tailDetail(l)))
	}
	tw.Flush()
}

// tailDetail is the last column of a tail line: the reason (a pass's
// trigger instead), the bytes, the error.
func tailDetail(l fleet.TailLine) string {
	detail := l.Reason
	if l.Trigger != "" {
		detail = "trigger=" + l.Trigger
	}
	switch {
	case l.DryRun && strings.HasSuffix(l.Type, ".skipped"):
		// What a dry run would have removed, and why.
		detail = "dry run: would remove (" + detail + ")"
	case l.DryRun:
		detail = strings.TrimSpace("dry run " + detail)
	}
	switch {
	case l.Bytes > 0 && l.Measured:
		detail += " freed " + humanBytes(l.Bytes)
	case l.Bytes > 0:
		detail += " est. " + humanBytes(l.Bytes)
	}
	if l.Error != "" {
		detail += " error=" + l.Error
	}
	return strings.TrimSpace(detail)
}

// forTerminal returns a string an event carries as it may reach an
// operator's terminal: as is when every rune is printable (non-ASCII letters
// included) and it holds no quote or backslash, else Go-quoted
// (strconv.Quote), so that escape sequences, carriage returns, newlines,
// tabs and invisible format characters show as escapes, and a quoted string
// cannot pass for a plain one.
func forTerminal(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || r == '"' || r == '\\' || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// changes is what watch printed last when its output is not a terminal
// (a pipe, a file, a log): after the whole table once, each tick prints
// only what changed, one line each, as kubectl get --watch does: the
// actions new in the tail, and the nodes whose figures changed (their
// ages do not count, or every node would change every tick).
type changes struct {
	tail map[fleet.TailLine]bool
	rows map[string]string // cluster/node: its figures as last printed
}

// newChanges starts from what the table just printed of f (nil on a
// terminal, which redraws the table instead).
func newChanges(f *fleet.Fleet, now time.Time, terminal bool) *changes {
	if terminal {
		return nil
	}
	c := &changes{}
	c.update(f, now)
	return c
}

// update records f as printed and returns the tail lines and node rows
// that changed since the last update, in order.
func (c *changes) update(f *fleet.Fleet, now time.Time) (lines []fleet.TailLine, rows []string) {
	tail := make(map[fleet.TailLine]bool)
	for _, l := range f.Tail() {
		tail[l] = true
		if c.tail != nil && !c.tail[l] {
			lines = append(lines, l)
		}
	}
	fresh := c.rows == nil
	c.tail = tail
	if fresh {
		c.rows = map[string]string{}
	}
	all := f.Rows(now)
	reasons := map[string][]string{}
	for _, l := range fleet.Looks(all) {
		reasons[l.Cluster+"/"+l.Node] = l.Reasons
	}
	for _, r := range all {
		key := r.Cluster + "/" + r.Node
		figures := rowFigures(r, reasons[key])
		if !fresh && c.rows[key] != figures {
			rows = append(rows, forTerminal(key)+"\t"+figures)
		}
		c.rows[key] = figures
	}
	return lines, rows
}

// print writes what changed in f since the last print.
func (c *changes) print(w io.Writer, f *fleet.Fleet, now time.Time) {
	lines, rows := c.update(f, now)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.At.Local().Format(time.TimeOnly),
			forTerminal(l.Node), forTerminal(l.Type), forTerminal(l.Subject), forTerminal(tailDetail(l)))
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\tnode\t%s\n", now.Local().Format(time.TimeOnly), r)
	}
	tw.Flush()
}

// rowFigures are a node row's figures that change with what happens on
// the node, not with time alone.
func rowFigures(r fleet.Row, looks []string) string {
	disk, images := "?", "?"
	if r.DiskUsagePercent >= 0 {
		disk = fmt.Sprintf("%d%%", r.DiskUsagePercent)
	}
	if r.Images >= 0 {
		images = fmt.Sprint(r.Images)
	}
	s := fmt.Sprintf("disk %s, images %s, removed img/ctr/log %d/%d/%d, outbox %d", disk, images,
		r.Removed["image"], r.Removed["container"], r.Removed["log"], r.Outbox)
	if !r.LastGC.IsZero() {
		s += ", last gc " + r.LastGC.Local().Format(time.TimeOnly) + " " + r.LastGCResult
	}
	if r.Starting {
		s += ", starting"
	}
	if len(looks) > 0 {
		s += ", needs a look: " + strings.Join(looks, ",")
	}
	return s
}
