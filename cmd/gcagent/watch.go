package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/fleet"
	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/flagvalue"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// watchOptions are the flags of `gcagent watch`.
type watchOptions struct {
	cfg          agent.Config // NATS URL, credentials, cluster, stream, domain
	since        time.Duration
	json         bool
	refresh      time.Duration
	tail         int
	node         string // glob on node names
	statusStream string
	view         view
	// once prints the fleet once (every node's last value, and the actions
	// of --since up to now) and exits, as kubectl get without --watch.
	once bool
}

// watchMsg is one message for the main loop: a node's last value or an event.
type watchMsg struct {
	status bool
	data   []byte
	loaded bool // the fleet's last values are all in (data is nil)
	// caughtUp: the actions of --since up to now are all in (data is nil).
	caughtUp bool
}

// watchCmd is `gcagent watch`: the fleet live from NATS.
func (c *cli) watchCmd() *cobra.Command {
	o := watchOptions{cfg: agent.DefaultConfig(), since: time.Minute, refresh: 2 * time.Second, tail: 15,
		statusStream: natsbus.DefaultStatusStream, view: defaultView}
	cmd := &cobra.Command{
		Use:   "watch [flags]",
		Short: "live fleet view from NATS",
		Long: "Shows the fleet live from NATS: every node's last status (from the status stream,\n" +
			"no history replayed), the nodes that need a look first, and the actions as they\n" +
			"come (and those of the last --since). The columns that count actions (FREED 1H,\n" +
			"FAILURES 1H, REMOVED) count the actions seen: from --since before watch started.\n" +
			"A node heard from but not yet by a heartbeat since it started is \"starting\".\n" +
			"Without --nats-url it reads the local agent's embedded server (credentials from\n" +
			"--state-dir).\n\n" +
			"On a terminal the table is redrawn every --refresh; into a pipe or a file it is\n" +
			"printed once, then only what changes: each new action and each node whose\n" +
			"figures changed, one line each. --once prints the table once and exits.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.watch(cmd, &o)
		},
	}
	fs := cmd.Flags()
	flagvalue.Add(fs, flagvalue.Duration{P: &o.since}, "since", "also show the actions of this long ago (0: only new ones); node status comes from the last values, not from history")
	flagvalue.Add(fs, flagvalue.Bool{P: &o.json}, "json", "print JSON lines instead of the table: {\"status\":...} per node value, {\"loaded\":...} once all are in, then the CloudEvents")
	flagvalue.Add(fs, flagvalue.Duration{P: &o.refresh}, "refresh", "how often the table is redrawn (on a terminal) or the changes are printed (else)")
	flagvalue.Add(fs, flagvalue.Bool{P: &o.once}, "once", "print the fleet once, with the actions of --since, and exit")
	flagvalue.Add(fs, flagvalue.Int{P: &o.tail}, "tail", "how many recent actions the table shows")
	fs.StringVar(&o.node, "node", "", "show only nodes whose name matches this `glob` (path.Match: node-1*, *-gpu-?)")
	flagvalue.Add(fs, flagvalue.Int{P: &o.view.top}, "top", "how many of the nodes that need a look are listed")
	flagvalue.Add(fs, flagvalue.Int{P: &o.view.rows, Hint: "0 = all"}, "rows", "how many node rows the table shows (0: all)")
	fs.StringVar(&o.statusStream, "nats-status-stream", o.statusStream, "JetStream stream of the nodes' last values")
	addNATSClientFlags(cmd, &o.cfg)
	setEnvHelp(cmd, envShared)
	return cmd
}

// watch shows the fleet from NATS: it loads every node's last value from
// the status stream, then follows the status stream and the events (from
// --since ago) live, as a table refreshed every --refresh with the nodes
// that need a look first and a tail of actions, or as JSON lines (--json).
func (c *cli) watch(cmd *cobra.Command, op *watchOptions) error {
	ctx, stdout, stderr := cmd.Context(), c.stdout, c.stderr
	start := time.Now()
	target, err := c.natsTool(cmd, &op.cfg) // settles the flags bound to *op
	if err != nil {
		return err
	}
	o := *op
	if _, err := path.Match(o.node, ""); err != nil {
		return usageError{fmt.Errorf("invalid --node %q: %v", o.node, err)}
	}
	if o.since < 0 || o.refresh <= 0 || o.tail < 0 || o.view.top < 0 || o.view.rows < 0 {
		return usageError{errors.New("--since, --tail, --top and --rows must not be negative, --refresh must be positive")}
	}
	if !natsbus.ValidDomain(o.statusStream) || o.statusStream == "" {
		return usageError{fmt.Errorf("invalid --nats-status-stream %q", o.statusStream)}
	}
	nc, err := connectTool(o.cfg, target)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsbus.NewJetStream(nc, o.cfg.NATSJSDomain)
	if err != nil {
		return err
	}
	msgs := make(chan watchMsg, 4096)
	stopStatus := followStatus(ctx, js, o, target, msgs, stderr)
	defer stopStatus()
	// The actions are tailed once every node's last value is in: the
	// fleet shows first, then what happens (from --since ago, so nothing
	// is missed in between).
	stopEvents := func() {}
	defer func() { stopEvents() }()
	tail := func() error {
		stop, err := followEvents(ctx, nc, js, o, target, msgs, stderr)
		if err == nil {
			stopEvents = stop
		}
		return err
	}
	if o.json {
		return watchJSON(ctx, msgs, o, start, stdout, tail)
	}
	f := fleet.New(o.tail)
	terminal := agent.IsTerminal(stdout)
	tick := time.NewTicker(o.refresh)
	defer tick.Stop()
	bad, loaded := 0, false
	var seen *changes // not a terminal: what was printed, so that only changes follow
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			switch {
			case m.loaded:
				loaded = true
				o.view.from, o.view.since = time.Now().Add(-o.since), o.since // what tail replays from
				if terminal && !o.once {
					renderView(stdout, f, time.Now(), o.cfg.NATSURL, bad, o.view) // at once: the whole fleet is in
				}
				if err := tail(); err != nil {
					return err
				}
			case m.caughtUp:
				// The actions of --since are in too: the table once, then
				// (not on a terminal) only what changes.
				if !terminal || o.once {
					renderView(stdout, f, time.Now(), o.cfg.NATSURL, bad, o.view)
					seen = newChanges(f, time.Now(), terminal)
				}
				if o.once {
					return nil
				}
			case !applyMsg(f, m, o):
				bad++
			}
			continue
		case <-tick.C:
		}
		switch {
		case o.once:
		case terminal:
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
			renderView(stdout, f, time.Now(), o.cfg.NATSURL, bad, o.view)
			if !loaded {
				fmt.Fprintln(stdout, "(still loading the nodes' last values)")
			}
		case seen != nil:
			seen.print(stdout, f, time.Now())
		}
	}
}

// applyMsg folds m into f unless --node filters it out; false when m cannot be decoded.
func applyMsg(f *fleet.Fleet, m watchMsg, o watchOptions) bool {
	if m.status {
		var st schema.NodeStatus
		if err := json.Unmarshal(m.data, &st); err != nil {
			return false
		}
		if nodeMatches(o.node, st.Node) {
			f.ApplyStatus(st)
		}
		return true
	}
	var ev natsbus.CloudEvent
	if err := json.Unmarshal(m.data, &ev); err != nil {
		return false
	}
	if _, node := fleet.SplitSource(ev.Source); nodeMatches(o.node, node) {
		f.Apply(ev)
	}
	return true
}

func nodeMatches(glob, node string) bool {
	if glob == "" {
		return true
	}
	ok, _ := path.Match(glob, node)
	return ok
}

// watchJSON prints every message as a JSON line: {"status": <NodeStatus>}
// for a node's last value, {"loaded": {"nodes": N, "seconds": S}} once
// every node's value is in, and each CloudEvent as it is.
func watchJSON(ctx context.Context, msgs <-chan watchMsg, o watchOptions, start time.Time, stdout io.Writer, tail func() error) error {
	nodes := 0
	for {
		var line []byte
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			switch {
			case m.caughtUp:
				if o.once {
					return nil
				}
				continue
			case m.loaded:
				line = fmt.Appendf(nil, `{"loaded":{"nodes":%d,"seconds":%.3f}}`, nodes, time.Since(start).Seconds())
				if err := tail(); err != nil {
					return err
				}
			case m.status:
				var st schema.NodeStatus
				if json.Unmarshal(m.data, &st) != nil || !nodeMatches(o.node, st.Node) {
					continue
				}
				nodes++
				line = append(append([]byte(`{"status":`), m.data...), '}')
			default:
				var ev natsbus.CloudEvent
				if json.Unmarshal(m.data, &ev) == nil {
					if _, node := fleet.SplitSource(ev.Source); !nodeMatches(o.node, node) {
						continue
					}
				}
				line = m.data
			}
		}
		if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
			return err
		}
	}
}

// clusterFilter is the subject filter under prefix for --cluster and,
// when --node names one node without wildcards, that node.
func clusterFilter(prefix string, o watchOptions) string {
	cluster := o.cfg.Cluster
	if cluster != "*" {
		cluster = natsbus.SafeToken(cluster)
	}
	if o.node != "" && !strings.ContainsAny(o.node, `*?[\`) {
		return prefix + "." + cluster + "." + natsbus.SafeToken(o.node)
	}
	return prefix + "." + cluster + ".>"
}

// followStatus delivers every node's last value (one message per node:
// deliver last per subject), then a loaded mark, then each new value as
// it is put. The ordered consumer is recreated by nats.go after
// reconnects. Without a status stream it says so once, sends the loaded
// mark (the nodes then come from their heartbeats) and retries every 30 s.
func followStatus(ctx context.Context, js jetstream.JetStream, o watchOptions, target natsTarget, msgs chan<- watchMsg, stderr io.Writer) func() {
	ctx, cancel := context.WithCancel(ctx)
	filter := clusterFilter(natsbus.StatusPrefix, o)
	send := func(m watchMsg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}
	stops := make(chan func(), 1)
	go func() {
		loadedSent, warned := false, ""
		for ctx.Err() == nil {
			stop, err := consumeStatus(ctx, js, o.statusStream, filter, send, &loadedSent)
			if err == nil {
				stops <- stop
				return
			}
			if !loadedSent {
				loadedSent = true
				send(watchMsg{loaded: true})
			}
			retry := 30 * time.Second
			if target.starting(err) {
				retry = 2 * time.Second // the agent makes it in a moment
			}
			if err.Error() != warned {
				warned = err.Error()
				if target.starting(err) {
					fmt.Fprintf(stderr, "gcagent watch: the local agent is starting: its status stream %s is not made yet%s; waiting for it\n", o.statusStream, target.hint())
				} else {
					fmt.Fprintf(stderr, "gcagent watch: no node status from stream %s (%v); nodes show up with their heartbeats; retrying\n", o.statusStream, err)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
		}
	}()
	return func() {
		cancel()
		select {
		case stop := <-stops:
			stop()
		default:
		}
	}
}

func consumeStatus(ctx context.Context, js jetstream.JetStream, stream, filter string, send func(watchMsg), loadedSent *bool) (func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := js.Stream(cctx, stream)
	if err != nil {
		return nil, err
	}
	// Whether any node matches: one subject per node. A filter narrower
	// than the whole stream asks the server for the matching subjects.
	var opts []jetstream.StreamInfoOpt
	if filter != natsbus.StatusPrefix+".*.>" {
		opts = append(opts, jetstream.WithSubjectFilter(filter))
	}
	info, err := st.Info(cctx, opts...)
	if err != nil {
		return nil, err
	}
	cons, err := st.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter},
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		return nil, err
	}
	if (info.State.NumSubjects == 0 || opts != nil && len(info.State.Subjects) == 0) && !*loadedSent {
		*loadedSent = true
		send(watchMsg{loaded: true})
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		send(watchMsg{status: true, data: m.Data()})
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 && !*loadedSent {
			*loadedSent = true
			send(watchMsg{loaded: true})
		}
	}, jetstream.PullMaxMessages(2000)) // a fleet's last values in a few pulls
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}

// followEvents delivers the events of the cluster from now-since on (only
// new ones with --since 0): an ordered consumer on the stream (recreated
// by nats.go after reconnects), or a core subscription without replay when
// the server has no stream. It retries until NATS answers or ctx ends,
// waiting longer each time (2 s doubling to 30 s), and says why once per cause.
func followEvents(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, o watchOptions, target natsTarget, msgs chan<- watchMsg, stderr io.Writer) (func(), error) {
	filter := clusterFilter(natsbus.EventPrefix, o)
	if strings.HasSuffix(filter, "."+natsbus.SafeToken(o.node)) {
		filter += ".>"
	}
	deliver := func(b []byte) {
		select {
		case msgs <- watchMsg{data: b}:
		case <-ctx.Done():
		}
	}
	var once sync.Once
	caughtUp := func() {
		once.Do(func() {
			select {
			case msgs <- watchMsg{caughtUp: true}:
			case <-ctx.Done():
			}
		})
	}
	warned := ""
	retry := 2 * time.Second
	for {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy}
		if o.since > 0 {
			start := time.Now().Add(-o.since)
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err := js.OrderedConsumer(cctx, o.cfg.NATSStream, cfg)
		cancel()
		if err == nil {
			cc, cerr := cons.Consume(func(m jetstream.Msg) {
				deliver(m.Data())
				if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
					caughtUp() // the last of what was stored when watch asked
				}
			})
			if cerr == nil {
				ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if info, err := cons.Info(ictx); err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream == 0 {
					caughtUp() // nothing stored to replay
				}
				cancel()
				return cc.Stop, nil
			}
			err = cerr
		}
		if target.starting(err) {
			// The local agent makes its stream in a moment: wait for it
			// rather than follow live events only.
			if warned != "starting" {
				warned = "starting"
				fmt.Fprintf(stderr, "gcagent watch: the local agent is starting: its event stream %s is not made yet%s; waiting for it\n",
					o.cfg.NATSStream, target.hint())
			}
		} else if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			fmt.Fprintf(stderr, "gcagent watch: no stream %s on %s (%v)%s; showing live events only, no history\n",
				o.cfg.NATSStream, target.url, err, target.hint())
			sub, err := nc.Subscribe(filter, func(m *nats.Msg) { deliver(m.Data) })
			if err != nil {
				return nil, err
			}
			go caughtUp() // no history to replay
			return func() { _ = sub.Unsubscribe() }, nil
		} else if err.Error() != warned {
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
