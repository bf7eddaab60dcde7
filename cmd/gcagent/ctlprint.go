package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
)

// printReplies prints control replies for a person: a table of nodes for
// status, a few lines per node for the other verbs, the error of a reply
// that failed. Strings a node sent are shown as forTerminal makes them.
func printReplies(w io.Writer, verb string, replies []natsbus.ControlReply) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	if verb == natsbus.VerbStatus {
		fmt.Fprintln(tw, "NODE\tSYNCED\tDISK\tIMAGES\tCONTAINERS\tDEAD\tPODS\tRECLAIMABLE\tOUTBOX\tVERSION")
	}
	for _, r := range replies {
		node := forTerminal(r.Node)
		if !r.OK {
			fmt.Fprintf(tw, "%s\terror: %s\n", node, plainText(r.Error))
			continue
		}
		var err error
		switch verb {
		case natsbus.VerbStatus:
			err = printStatusReply(tw, node, r.Data)
		case natsbus.VerbPlan:
			err = printPlanReply(tw, node, r.Data)
		case natsbus.VerbExplain:
			err = printExplainReply(tw, node, r.Data)
		case natsbus.VerbGC:
			err = printGCReply(tw, node, r.Data)
		default:
			err = fmt.Errorf("unknown verb")
		}
		if err != nil { // a newer agent's reply: show it as it came
			fmt.Fprintf(tw, "%s\t%s\n", node, forTerminal(string(r.Data)))
		}
	}
}

func printStatusReply(w io.Writer, node string, data json.RawMessage) error {
	var st agent.ControlStatus
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	disk := fmt.Sprintf("%d%% of %s", st.DiskUsagePercent, humanBytes(int64(st.CapacityBytes)))
	if st.DiskError != "" {
		disk = "? (" + forTerminal(st.DiskError) + ")"
	}
	outbox := fmt.Sprint(st.Outbox)
	if st.NATSMode != "" && st.NATSMode != natsbus.ModeJetStream {
		outbox += " (" + forTerminal(st.NATSMode) + ")"
	}
	fmt.Fprintf(w, "%s\t%v\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", node, st.Synced, disk, st.Images, st.Containers,
		st.DeadContainer, st.Pods, humanBytes(st.ReclaimableBytes), outbox, forTerminal(st.Version))
	return nil
}

func printPlanReply(w io.Writer, node string, data json.RawMessage) error {
	var p agent.ControlPlan
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	img := p.Images
	trigger := "not triggered"
	if img.Triggered {
		trigger = "triggered, " + humanBytes(img.AmountToFree) + " to free"
	}
	fmt.Fprintf(w, "%s\tsynced %v; disk %d%% used, threshold GC %s; images: %d to delete (%s estimated), %d kept; containers: %d to remove, %d kept\n",
		node, p.Synced, img.Usage, trigger, len(img.Delete), humanBytes(img.EstimatedBytes), len(img.Keep),
		len(p.Containers.Remove), len(p.Containers.Keep))
	if p.DryRun {
		fmt.Fprintf(w, "\tdry run (--dry-run): the agent deletes none of them, it logs each as would remove\n")
	}
	for _, it := range img.Delete {
		fmt.Fprintf(w, "\tdelete image %s (%s, %s, last used %s)\n", forTerminal(imageName(it)), it.Reason, humanBytes(it.Size), lastUsedShown(it))
	}
	for _, it := range p.Containers.Remove {
		fmt.Fprintf(w, "\tremove container %s (%s)\n", forTerminal(short(it.ID)), it.Reason)
	}
	return nil
}

func printExplainReply(w io.Writer, node string, data json.RawMessage) error {
	var ex agent.ControlExplanation
	if err := json.Unmarshal(data, &ex); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s\t%s: %s: %s\n", node, forTerminal(ex.Query), ex.Decision, plainText(ex.Why))
	return nil
}

func printGCReply(w io.Writer, node string, data json.RawMessage) error {
	var p gc.ImagePass
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s\tpass (%s): usage %d%% -> %d%%, removed %d, skipped %d, %s estimated, %s measured freed",
		node, p.Trigger, p.Usage, p.UsageAfter, len(p.Removed), len(p.Skipped), humanBytes(p.EstimatedBytes), humanBytes(p.FreedBytes))
	if p.Error != "" {
		fmt.Fprintf(w, ", error: %s", plainText(p.Error))
	}
	fmt.Fprintln(w)
	return nil
}

// imageName is the name an image item shows: the one a rule matched, else
// its names without CRI's id name.
func imageName(it gc.ImageItem) string {
	if it.Name != "" {
		return it.Name
	}
	if n := displayNames(it.Names); n != "" {
		return n
	}
	return it.Digest
}

func lastUsedShown(it gc.ImageItem) string {
	if it.LastUsed.IsZero() {
		return "never"
	}
	return it.LastUsed.Format("2006-01-02T15:04:05Z07:00")
}

// plainText is a sentence a node sent (an error, a reason), as is when
// every rune is printable, else Go-quoted so that no escape sequence
// reaches the terminal. Unlike forTerminal it leaves quotes alone: a
// sentence quotes the names in it.
func plainText(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
