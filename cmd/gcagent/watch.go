package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/gcagent/gcagent/events"
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

// natsClientFlags binds the flags a NATS client command shares with run.
func natsClientFlags(fs *flag.FlagSet, cfg *agent.Config) {
	fs.StringVar(&cfg.NATSURL, "nats-url", cfg.NATSURL, "NATS server URLs, comma separated (run: empty starts an embedded server)")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "cluster name in NATS subjects (watch: * for every cluster)")
	fs.StringVar(&cfg.NATSCreds, "nats-creds", cfg.NATSCreds, "NATS credentials file")
	fs.StringVar(&cfg.NATSNKey, "nats-nkey", cfg.NATSNKey, "NATS nkey seed file")
	fs.StringVar(&cfg.NATSUser, "nats-user", cfg.NATSUser, "NATS user")
	fs.StringVar(&cfg.NATSPassword, "nats-password", cfg.NATSPassword, "NATS password")
	fs.StringVar(&cfg.NATSToken, "nats-token", cfg.NATSToken, "NATS token")
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", cfg.NATSTLSCA, "CA file for the NATS server certificate")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", cfg.NATSTLSCert, "client certificate for NATS mTLS")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", cfg.NATSTLSKey, "client key for NATS mTLS")
	fs.StringVar(&cfg.NATSStream, "nats-stream", cfg.NATSStream, "JetStream stream of events")
}

// localStateDirFlag binds --state-dir for a local NATS client: where it
// finds the local agent's embedded server URL and credentials.
func localStateDirFlag(fs *flag.FlagSet, cfg *agent.Config) {
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "the local agent's state dir: without --nats-url, the embedded NATS server's URL and credentials are read from it")
}

// parseNATSClient parses a NATS client command's flags, then fills the ones
// not given from GCAGENT_<FLAG> like run does. The connection is named
// gcagent/<cluster>/<tool>@<host>, which control requests carry as their caller.
func parseNATSClient(fs *flag.FlagSet, cfg *agent.Config, args []string, env func(string) string, tool string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	onCLI := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCLI[f.Name] = true })
	// Only the settings shared with run come from the environment: a tool's
	// own flags (--image, --json, ...) are never set behind its back.
	shared := flag.NewFlagSet("", flag.ContinueOnError)
	natsClientFlags(shared, &agent.Config{})
	localStateDirFlag(shared, &agent.Config{})
	var err error
	shared.VisitAll(func(f *flag.Flag) {
		if v := env(envName(f.Name)); v != "" && !onCLI[f.Name] && err == nil && fs.Lookup(f.Name) != nil {
			err = setFlag(fs, f.Name, v, envName(f.Name))
		}
	})
	if err != nil {
		return usageError{err}
	}
	if cfg.NATSURL == "" && !cfg.HasNATSAuth() {
		// The local agent's embedded server: its URL and credentials are in
		// its state dir.
		url, seed, err := natsbus.LocalClient(cfg.StateDir)
		if err != nil {
			return fmt.Errorf("%v (give --nats-url and credentials, or run as the agent's user)", err)
		}
		cfg.NATSURL, cfg.NATSNKey = url, seed
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://" + agent.DefaultConfig().EmbeddedNATSListen
	}
	host, _ := os.Hostname()
	cfg.NodeName = tool + "@" + host
	if err := cfg.ConnOptions().Validate(); err != nil {
		return usageError{fmt.Errorf("invalid NATS settings: %v", err)}
	}
	return nil
}

// watch shows the fleet from NATS: it replays the last --since of events
// from the stream, then follows it live, as a table refreshed every
// --refresh with a tail of actions, or as raw CloudEvents (--json).
func watch(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	o := watchOptions{cfg: agent.DefaultConfig(), since: time.Hour, refresh: 2 * time.Second, tail: 15}
	o.cfg.NATSURL = ""
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsClientFlags(fs, &o.cfg)
	localStateDirFlag(fs, &o.cfg)
	fs.DurationVar(&o.since, "since", o.since, "replay events from this long ago")
	fs.BoolVar(&o.json, "json", o.json, "print the raw CloudEvents, one per line, instead of the table")
	fs.DurationVar(&o.refresh, "refresh", o.refresh, "how often the table is redrawn")
	fs.IntVar(&o.tail, "tail", o.tail, "how many recent actions the table shows")
	if err := parseNATSClient(fs, &o.cfg, args, env, "watch"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if o.since < 0 || o.refresh <= 0 || o.tail < 0 {
		return usageError{errors.New("--since and --tail must not be negative, --refresh must be positive")}
	}
	nc, err := natsbus.Connect(o.cfg.ConnOptions())
	if err != nil {
		return err
	}
	defer nc.Close()

	msgs := make(chan []byte, 4096)
	stop, err := followEvents(ctx, nc, o, msgs, stderr)
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
	f := newFleet(o.tail)
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
			f.apply(ev)
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
// no stream. It retries until NATS answers or ctx ends.
func followEvents(ctx context.Context, nc *nats.Conn, o watchOptions, msgs chan<- []byte, stderr io.Writer) (func(), error) {
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
			fmt.Fprintf(stderr, "gcagent watch: no stream %s (%v): showing live events only, no history\n", o.cfg.NATSStream, err)
			sub, err := nc.Subscribe(filter, func(m *nats.Msg) { deliver(m.Data) })
			if err != nil {
				return nil, err
			}
			return func() { _ = sub.Unsubscribe() }, nil
		}
		if err.Error() != warned {
			warned = err.Error()
			fmt.Fprintf(stderr, "gcagent watch: cannot read stream %s yet: %v; retrying\n", o.cfg.NATSStream, err)
		}
		select {
		case <-ctx.Done():
			return func() {}, nil
		case <-time.After(2 * time.Second):
		}
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

// fleet is the fleet as the events tell it: one row per node and the
// latest actions. apply is a pure fold; it does no I/O.
type fleet struct {
	nodes   map[string]*fleetNode // by event source
	tail    []tailLine            // newest last, at most maxTail
	maxTail int
}

// fleetNode is what the events say about one node.
type fleetNode struct {
	Cluster, Node string
	// From the latest heartbeat.
	HasDisk          bool
	DiskUsagePercent int
	Images           int
	Outbox           int
	NATSMode         string
	LastHeartbeat    time.Time
	Started          time.Time
	// From gc.completed / gc.failed.
	LastGC       time.Time
	LastGCResult string
	freed        []sample // bytes freed per pass, by pass end
	failures     []time.Time
	LastEvent    time.Time
	Removed      map[string]int // kind -> removals seen
}

type sample struct {
	at    time.Time
	bytes int64
}

// tailLine is one action in the tail.
type tailLine struct {
	At      time.Time
	Node    string
	Type    string // kind.action
	Subject string
	Detail  string
}

// fleetRow is one line of the fleet table as of a given time.
type fleetRow struct {
	Cluster, Node    string
	DiskUsagePercent int // -1 unknown
	Images           int // -1 unknown
	LastGC           time.Time
	LastGCResult     string
	FreedLastHour    int64
	FailuresLastHour int
	HeartbeatAge     time.Duration // -1 never
	Outbox           int
	NATSMode         string
	Removed          map[string]int
}

func newFleet(maxTail int) *fleet {
	return &fleet{nodes: map[string]*fleetNode{}, maxTail: maxTail}
}

// apply folds one event into the fleet. Events of unknown types still
// count as a sign of life and go into the tail.
func (f *fleet) apply(ev natsbus.CloudEvent) {
	n := f.nodes[ev.Source]
	if n == nil {
		cluster, node := splitSource(ev.Source)
		n = &fleetNode{Cluster: cluster, Node: node, Removed: map[string]int{}}
		f.nodes[ev.Source] = n
	}
	if ev.Time.After(n.LastEvent) {
		n.LastEvent = ev.Time
	}
	kind, action, _ := strings.Cut(strings.TrimPrefix(ev.Type, "io.gcagent."), ".")
	var d struct {
		DiskUsagePercent *int   `json:"diskUsagePercent"`
		Images           *int   `json:"images"`
		Outbox           int    `json:"outbox"`
		NATSMode         string `json:"natsMode"`
		FreedBytes       int64  `json:"freedBytes"`
		Bytes            int64  `json:"bytes"`
		Reason           string `json:"reason"`
		Error            string `json:"error"`
		Trigger          string `json:"trigger"`
		// What names the object for a person (image.*, container.removed).
		Digest        string   `json:"digest"`
		Names         []string `json:"names"`
		ContainerName string   `json:"containerName"`
		PodName       string   `json:"podName"`
		PodNamespace  string   `json:"podNamespace"`
		Namespace     string   `json:"namespace"` // containerd's
	}
	_ = json.Unmarshal(ev.Data, &d) // a payload of another shape leaves d empty
	switch {
	case kind == "agent" && action == "heartbeat":
		if ev.Time.After(n.LastHeartbeat) {
			n.LastHeartbeat = ev.Time
			if d.DiskUsagePercent != nil {
				n.HasDisk, n.DiskUsagePercent = true, *d.DiskUsagePercent
			}
			if d.Images != nil {
				n.Images = *d.Images
			}
			n.Outbox, n.NATSMode = d.Outbox, d.NATSMode
		}
		return // heartbeats stay out of the tail
	case kind == "agent" && action == "started":
		if ev.Time.After(n.Started) {
			n.Started = ev.Time
		}
	case kind == "gc" && (action == "completed" || action == "failed"):
		if !ev.Time.Before(n.LastGC) {
			n.LastGC, n.LastGCResult = ev.Time, action
		}
		n.freed = append(n.freed, sample{ev.Time, d.FreedBytes})
	case action == "removed":
		n.Removed[kind]++
	}
	if action == "failed" || (action == "skipped" && strings.Contains(d.Reason, "fail")) {
		n.failures = append(n.failures, ev.Time)
	}
	detail := d.Reason
	if d.Trigger != "" {
		detail = "trigger=" + d.Trigger
	}
	if b := cmp.Or(d.FreedBytes, d.Bytes); b > 0 {
		detail += " " + humanBytes(b)
	}
	if d.Error != "" {
		detail += " error=" + d.Error
	}
	subject := ev.Subject
	switch kind {
	case "image":
		subject = imageLabel(d.Names, cmp.Or(d.Digest, ev.Subject))
	case "container":
		subject = containerLabel(ev.Subject, d.PodNamespace, d.PodName, d.ContainerName)
	}
	if (kind == "image" || kind == "container") && d.Namespace != "" && d.Namespace != events.CRINamespace {
		subject = d.Namespace + ": " + subject // k8s.io is the usual one: said only for the others
	}
	f.tail = append(f.tail, tailLine{At: ev.Time, Node: n.Node, Type: kind + "." + action, Subject: subject, Detail: strings.TrimSpace(detail)})
	// Replayed and live events may interleave across nodes: keep time order.
	slices.SortStableFunc(f.tail, func(a, b tailLine) int { return a.At.Compare(b.At) })
	if len(f.tail) > f.maxTail {
		f.tail = slices.Delete(f.tail, 0, len(f.tail)-f.maxTail)
	}
	// Forget what can no longer be in a one-hour window of any later now.
	n.freed = slices.DeleteFunc(n.freed, func(s sample) bool { return ev.Time.Sub(s.at) > 2*time.Hour })
	n.failures = slices.DeleteFunc(n.failures, func(t time.Time) bool { return ev.Time.Sub(t) > 2*time.Hour })
}

// imageLabel names an image as an operator reads it: its names (tags
// first; the sha256: id names CRI adds say nothing) and the digest,
// shortened. Without a name, the short digest alone.
func imageLabel(names []string, digest string) string {
	var tags []string
	for _, n := range names {
		if !strings.HasPrefix(n, "sha256:") {
			tags = append(tags, n)
		}
	}
	short := shortDigest(digest)
	if len(tags) == 0 {
		return short
	}
	return strings.Join(tags, ",") + " (" + short + ")"
}

// shortDigest keeps the algorithm and 12 hex digits, like docker's ids.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok {
		algo, hex = "", d
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	if algo == "" {
		return hex
	}
	return algo + ":" + hex
}

// containerLabel names a removed container: pod namespace/name and
// container name for CRI containers, with the id shortened; the id alone
// for plain containers (their ids are chosen by people).
func containerLabel(id, podNamespace, podName, container string) string {
	if podName == "" && container == "" {
		return id
	}
	short := id
	if len(short) > 12 {
		short = short[:12]
	}
	return fmt.Sprintf("%s/%s %s (%s)", podNamespace, podName, container, short)
}

// rows returns the table as of now, ordered by cluster and node.
func (f *fleet) rows(now time.Time) []fleetRow {
	out := make([]fleetRow, 0, len(f.nodes))
	hour := now.Add(-time.Hour)
	for _, n := range f.nodes {
		r := fleetRow{Cluster: n.Cluster, Node: n.Node, DiskUsagePercent: -1, Images: -1, LastGC: n.LastGC,
			LastGCResult: n.LastGCResult, HeartbeatAge: -1, Outbox: n.Outbox, NATSMode: n.NATSMode, Removed: n.Removed}
		if n.HasDisk {
			r.DiskUsagePercent = n.DiskUsagePercent
		}
		if !n.LastHeartbeat.IsZero() {
			r.Images = n.Images
			r.HeartbeatAge = max(now.Sub(n.LastHeartbeat), 0)
		}
		for _, s := range n.freed {
			if !s.at.Before(hour) && !s.at.After(now) {
				r.FreedLastHour += s.bytes
			}
		}
		for _, t := range n.failures {
			if !t.Before(hour) && !t.After(now) {
				r.FailuresLastHour++
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b fleetRow) int { return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Node, b.Node)) })
	return out
}

// splitSource reads gcagent/<cluster>/<node>; the node may contain '/'.
func splitSource(src string) (cluster, node string) {
	rest, ok := strings.CutPrefix(src, "gcagent/")
	if !ok {
		return "?", src
	}
	cluster, node, ok = strings.Cut(rest, "/")
	if !ok {
		return "?", rest
	}
	return cluster, node
}

// renderFleet prints the table and the tail as of now.
func renderFleet(w io.Writer, f *fleet, now time.Time, url string, bad int) {
	rows := f.rows(now)
	fmt.Fprintf(w, "gcagent fleet  %s  %s  nodes: %d", now.Format(time.TimeOnly), natsbus.RedactURL(url), len(rows))
	if bad > 0 {
		fmt.Fprintf(w, "  undecodable events: %d", bad)
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNODE\tDISK\tIMAGES\tLAST GC\tFREED 1H\tFAILURES 1H\tREMOVED (img/ctr/log)\tOUTBOX\tHEARTBEAT")
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
	if len(f.tail) == 0 {
		return
	}
	fmt.Fprintln(w, "\nRECENT ACTIONS")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range f.tail {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.At.Local().Format(time.TimeOnly),
			forTerminal(l.Node), forTerminal(l.Type), forTerminal(l.Subject), forTerminal(l.Detail))
	}
	tw.Flush()
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
