package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/gcagent/gcagent/fleet"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"
)

// watchOptions are the flags of `gcagent watch`.
type watchOptions struct {
	cfg     agent.Config // NATS URL, credentials, cluster, stream
	since   time.Duration
	json    bool
	refresh time.Duration
	tail    int
}

// watch shows the fleet from NATS: it replays the last --since of events
// from the stream, then follows it live, as a table refreshed every
// --refresh with a tail of actions, or as raw CloudEvents (--json).
func watch(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	o := watchOptions{cfg: agent.DefaultConfig(), since: time.Hour, refresh: 2 * time.Second, tail: 15}
	o.cfg.NATSURL = ""
	fs := newFlagSet("watch")
	natsClientFlags(fs, &o.cfg)
	localStateDirFlag(fs, &o.cfg)
	fs.Var(durationValue{&o.since}, "since", "replay events from this long ago")
	fs.BoolVar(&o.json, "json", o.json, "print the raw CloudEvents, one per line, instead of the table")
	fs.Var(durationValue{&o.refresh}, "refresh", "how often the table is redrawn")
	fs.IntVar(&o.tail, "tail", o.tail, "how many recent actions the table shows")
	h := help{Usage: "gcagent watch [flags]", Env: "shared",
		About: "Shows the fleet live from NATS: a table of nodes and recent actions, replayed\n" +
			"from --since and then followed, or the raw CloudEvents (--json). Without\n" +
			"--nats-url it reads the local agent's embedded server (credentials from --state-dir)."}
	target, err := parseNATSClient(fs, &o.cfg, args, env, h, stdout)
	if err != nil {
		return err
	}
	if o.since < 0 || o.refresh <= 0 || o.tail < 0 {
		return usageError{errors.New("--since and --tail must not be negative, --refresh must be positive")}
	}
	nc, err := connectTool(o.cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()

	msgs := make(chan []byte, 4096)
	stop, err := followEvents(ctx, nc, o, target, msgs, stderr)
	if err != nil {
		return err
	}
	defer stop()

	if o.json {
		for {
			select {
			case <-ctx.Done():
				return nil
			case b := <-msgs:
				if _, err := fmt.Fprintf(stdout, "%s\n", b); err != nil {
					return err
				}
			}
		}
	}
	f := fleet.New(o.tail)
	clear := isTerminal(stdout)
	tick := time.NewTicker(o.refresh)
	defer tick.Stop()
	bad := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case b := <-msgs:
			var ev natsbus.CloudEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				bad++
				continue
			}
			f.Apply(ev)
			continue
		case <-tick.C:
		}
		if clear {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
		}
		renderFleet(stdout, f, time.Now(), o.cfg.NATSURL, bad)
	}
}

// followEvents starts delivering the events of the cluster from now-since
// on msgs: an ordered consumer on the stream (recreated by nats.go after
// reconnects), or a core subscription without replay when the server has
// no stream. It retries until NATS answers or ctx ends, waiting longer
// each time (2 s doubling to 30 s), and says why once per cause.
func followEvents(ctx context.Context, nc *nats.Conn, o watchOptions, target natsTarget, msgs chan<- []byte, stderr io.Writer) (func(), error) {
	cluster := o.cfg.Cluster
	if cluster != "*" {
		cluster = natsbus.SafeToken(cluster)
	}
	filter := natsbus.EventPrefix + "." + cluster + ".>"
	deliver := func(b []byte) {
		select {
		case msgs <- b:
		case <-ctx.Done():
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	warned := ""
	retry := 2 * time.Second
	for {
		start := time.Now().Add(-o.since)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err := js.OrderedConsumer(cctx, o.cfg.NATSStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
		})
		cancel()
		if err == nil {
			cc, cerr := cons.Consume(func(m jetstream.Msg) { deliver(m.Data()) })
			if cerr == nil {
				return cc.Stop, nil
			}
			err = cerr
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			fmt.Fprintf(stderr, "gcagent watch: no stream %s on %s (%v)%s; showing live events only, no history\n",
				o.cfg.NATSStream, target.url, err, target.hint())
			sub, err := nc.Subscribe(filter, func(m *nats.Msg) { deliver(m.Data) })
			if err != nil {
				return nil, err
			}
			return func() { _ = sub.Unsubscribe() }, nil
		}
		if err.Error() != warned {
			warned = err.Error()
			fmt.Fprintf(stderr, "gcagent watch: no stream %s answers on %s (%v)%s; retrying\n",
				o.cfg.NATSStream, target.url, err, target.hint())
		}
		select {
		case <-ctx.Done():
			return func() {}, nil
		case <-time.After(retry):
		}
		retry = min(retry*2, 30*time.Second)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// renderFleet prints the table and the tail of f as of now.
func renderFleet(w io.Writer, f *fleet.Fleet, now time.Time, url string, bad int) {
	rows := f.Rows(now)
	fmt.Fprintf(w, "gcagent fleet  %s  %s  nodes: %d", now.Format(time.TimeOnly), natsbus.RedactURL(url), len(rows))
	if bad > 0 {
		fmt.Fprintf(w, "  undecodable events: %d", bad)
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNODE\tDISK\tIMAGES\tLAST GC\tFREED 1H (MEASURED)\tFAILURES 1H\tREMOVED (img/ctr/log)\tOUTBOX\tHEARTBEAT")
	for _, r := range rows {
		disk, images, hb, last := "?", "?", "never", "never"
		if r.DiskUsagePercent >= 0 {
			disk = fmt.Sprintf("%d%%", r.DiskUsagePercent)
		}
		if r.Images >= 0 {
			images = fmt.Sprint(r.Images)
		}
		if r.HeartbeatAge >= 0 {
			hb = r.HeartbeatAge.Round(time.Second).String() + " ago"
		}
		if !r.LastGC.IsZero() {
			last = now.Sub(r.LastGC).Round(time.Second).String() + " ago"
			if r.LastGCResult == "failed" {
				last += " (failed)"
			}
		}
		outbox := fmt.Sprint(r.Outbox)
		if r.NATSMode != "" && r.NATSMode != natsbus.ModeJetStream {
			outbox += " (" + forTerminal(r.NATSMode) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%s\t%s\n", forTerminal(r.Cluster), forTerminal(r.Node), disk, images, last,
			humanBytes(r.FreedLastHour), r.FailuresLastHour, r.Removed["image"], r.Removed["container"], r.Removed["log"], outbox, hb)
	}
	tw.Flush()
	tail := f.Tail()
	if len(tail) == 0 {
		return
	}
	fmt.Fprintln(w, "\nRECENT ACTIONS")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
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
