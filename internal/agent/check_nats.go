package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
)

// The nats line of gcagent check.

// checkNATS connects to --nats-url with the given credentials; without
// one, to the embedded server of an agent running on the state dir, if
// any, and, when that server cannot be reached (its address not bound),
// says what the agent itself reports of it (agentNATSNotes). A server
// older than natsbus.MinServerVersion fails. The line also says what
// fleet keep list this node has (keepListNote).
func checkNATS(ctx context.Context, cfg Config) CheckResult {
	nc, what, res := checkConnect(ctx, cfg)
	if nc == nil {
		if !strings.Contains(res.Detail, "fleet keep list") {
			res.Detail += "; " + keepListNote(ctx, cfg, nil, cfg.NATSURL == "" && res.Status == CheckOK, &res)
		}
		return res
	}
	defer nc.Close()
	v := nc.ConnectedServerVersion()
	if err := natsbus.CheckServerVersion(v, "gcagent"); err != nil {
		return failLine("nats", "%s: %v", what, err)
	}
	res = okLine("nats", "%s: connected (server %s)", what, v)
	res.Detail += "; " + keepListNote(ctx, cfg, nc, false, &res)
	return res
}

// checkConnect connects as checkNATS does; a nil connection comes with
// the line to print instead.
func checkConnect(ctx context.Context, cfg Config) (*nats.Conn, string, CheckResult) {
	o := cfg.ConnOptions()
	o.FailFast = true
	what := natsbus.RedactURL(cfg.NATSURL)
	if cfg.NATSURL == "" {
		url, seed, err := natsbus.LocalClient(cfg.StateDir)
		if err != nil {
			return nil, "", failLine("nats", "embedded server: %v", err)
		}
		if url == "" {
			return nil, "", embeddedUnreached(ctx, cfg, nil)
		}
		o = natsbus.ConnOptions{URL: url, NkeyFile: seed, Cluster: cfg.Cluster, Node: cfg.NodeName, FailFast: true}
		what = "embedded server at " + url
	}
	nc, err := natsbus.Connect(o)
	if err != nil {
		if cfg.NATSURL == "" {
			return nil, "", embeddedUnreached(ctx, cfg, fmt.Errorf("%s: %w", what, err))
		}
		return nil, "", failLine("nats", "%s: %v", what, err)
	}
	return nc, what, CheckResult{}
}

// embeddedUnreached is the nats line when no local client reaches the
// embedded server (no URL recorded: its address never bound in this
// run; or connectErr): what the agent at --metrics-address says of its
// server and of the fleet keep list, or, with no agent answering there,
// that none runs.
func embeddedUnreached(ctx context.Context, cfg Config, connectErr error) CheckResult {
	notes, err := agentNATSNotes(ctx, cfg.MetricsAddress)
	switch {
	case err != nil && connectErr != nil && !errors.Is(connectErr, syscall.ECONNREFUSED) && !strings.Contains(connectErr.Error(), "no servers available"):
		return failLine("nats", "%v (and no agent answers on --metrics-address %s: %v)", connectErr, cfg.MetricsAddress, err)
	case err != nil:
		return okLine("nats", "embedded server: no agent runs on %s now (started by run; nothing answers on --metrics-address %s)", cfg.StateDir, cfg.MetricsAddress)
	}
	var server, keep []string
	for _, n := range notes {
		if rest, ok := strings.CutPrefix(n, "fleet keep list: "); ok {
			keep = append(keep, rest)
		} else {
			server = append(server, strings.TrimPrefix(n, "nats: "))
		}
	}
	var res CheckResult
	if len(server) > 0 {
		res = warnLine("nats", "embedded server: the agent on --metrics-address %s says: %s", cfg.MetricsAddress, strings.Join(server, "; "))
	} else if connectErr != nil {
		res = warnLine("nats", "embedded server: the agent on --metrics-address %s runs, but local tools cannot reach its server: %v", cfg.MetricsAddress, connectErr)
	} else {
		res = warnLine("nats", "embedded server: the agent on --metrics-address %s runs, but recorded no URL for local tools in %s", cfg.MetricsAddress, cfg.StateDir)
	}
	if len(keep) == 0 {
		res.Detail += "; fleet keep list: known (the agent's /readyz names no problem with it)"
	} else {
		res.Detail += "; fleet keep list: " + strings.Join(keep, "; ")
	}
	return res
}

// agentNATSNotes asks the agent at addr for its /readyz and returns its
// lines about NATS and the fleet keep list; an error when no agent
// answers there.
func agentNATSNotes(ctx context.Context, addr string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "nats: ") || strings.HasPrefix(l, "fleet keep list: ") {
			out = append(out, l)
		}
	}
	return out, nil
}

// keepListNote says what fleet keep list this node has: the list its
// agent saved in the state dir, and what NATS gives on nc (read as the
// agent reads it, one watcher per key; nil: not asked, embedded says the
// agent's own server will give it at start). Without a saved list and with
// NATS not giving one, image deletes wait for it at start
// (--keep-list-wait): res becomes a WARN that says so; a server too old
// for the watch makes it a FAIL.
func keepListNote(ctx context.Context, cfg Config, nc *nats.Conn, embedded bool, res *CheckResult) string {
	saved, haveSaved := "no list saved in "+filepath.Join(cfg.StateDir, KeepListFile), false
	doc, ferr := ReadKeepFile(cfg.StateDir)
	switch {
	case ferr == nil && !doc.ConfirmedAt.IsZero() && doc.Source != keepSource(cfg):
		k := &fleetKeep{keys: []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cfg.Cluster)}, doc: doc}
		saved = fmt.Sprintf("a list saved from another NATS (%s; %d patterns, which keep) and none read from this one",
			cmp.Or(doc.Source, "unknown"), len(k.patterns()))
	case ferr == nil && !doc.ConfirmedAt.IsZero():
		k := &fleetKeep{keys: []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cfg.Cluster)}, doc: doc}
		saved, haveSaved = fmt.Sprintf("saved list: %d patterns, confirmed by NATS %s ago", len(k.patterns()), time.Since(doc.ConfirmedAt).Round(time.Second)), true
	case ferr != nil && !errors.Is(ferr, fs.ErrNotExist):
		saved = fmt.Sprintf("saved list unreadable (%v): the agent starts as with none", ferr)
	}
	warn := func(why string) string {
		if res.Status == CheckOK {
			res.Status = CheckWarn
		}
		if haveSaved {
			return fmt.Sprintf("fleet keep list: not read (%s); the agent keeps by the %s", why, saved)
		}
		if cfg.KeepListWait == 0 {
			return fmt.Sprintf("fleet keep list: not read (%s), %s: image GC does not wait for it (--keep-list-wait 0s) and keeps by --keep-image only until NATS answers", why, saved)
		}
		return fmt.Sprintf("fleet keep list: not read (%s), %s: image deletes by threshold or maximum age wait for it up to --keep-list-wait %s at start, then go on with --keep-image only",
			why, saved, cfg.KeepListWait)
	}
	if nc == nil {
		if embedded {
			return embeddedKeepNote(cfg, saved, haveSaved)
		}
		return warn("NATS does not answer")
	}
	patterns, err := readKeepList(ctx, cfg, nc)
	switch cause := natsbus.KeepWatchCause(err); {
	case err == nil:
		return fmt.Sprintf("fleet keep list: %d patterns for cluster %s (%s); %s", len(patterns), cfg.Cluster, orNone(patterns), saved)
	case cause == natsbus.KeepCauseBucketNotFound:
		return fmt.Sprintf("fleet keep list: none (no bucket %s); %s", natsbus.KeepBucket, saved)
	case cause == natsbus.KeepCauseServerTooOld:
		res.Status = CheckFail
		return fmt.Sprintf("fleet keep list: %v", err)
	default:
		return warn(cause + ": " + err.Error())
	}
}

// embeddedKeepNote says what fleet keep list an agent starting on its
// embedded server will have, from its own store: none in a store without
// the bucket, the list it saved itself, or, without a copy saved from
// it, what the server (which runs in process whatever its address) gives.
func embeddedKeepNote(cfg Config, saved string, haveSaved bool) string {
	stored, err := natsbus.EmbeddedKeepStored(cfg.StateDir)
	switch {
	case err != nil:
		return fmt.Sprintf("fleet keep list: read from the embedded server's store at start (%v); %s", err, saved)
	case !stored:
		return "fleet keep list: none (the embedded server's store holds no bucket " + natsbus.KeepBucket + "): known empty at start, image deletes do not wait"
	case haveSaved:
		return "fleet keep list: the agent's own store, known at start from its " + saved
	}
	return "fleet keep list: read from the embedded server's store at start, in process; " + saved
}

// readKeepList reads the fleet keep list of cfg's cluster from nc once, as
// the agent's watch reads it (one watcher per key, in --nats-js-domain),
// within checkTimeout: the patterns, sorted; an error when NATS does not
// give it (a missing bucket: jetstream.ErrBucketNotFound, wrapped).
func readKeepList(ctx context.Context, cfg Config, nc *nats.Conn) ([]string, error) {
	js, err := natsbus.NewJetStream(nc, cfg.NATSJSDomain)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	patterns := map[string]bool{}
	synced := false
	err = natsbus.WatchKeep(wctx, js, []string{natsbus.KeepAllKey, natsbus.KeepClusterKey(cfg.Cluster)}, natsbus.KeepWatchOptions{}, func(u natsbus.KeepUpdate) {
		switch {
		case u.Synced:
			synced = true
			cancel()
		case u.Err == nil:
			for _, p := range u.List.Patterns {
				if gc.ValidKeepPattern(p) == nil {
					patterns[p] = true
				}
			}
		}
	})
	if synced {
		return slices.Sorted(maps.Keys(patterns)), nil
	}
	if err == nil {
		err = wctx.Err()
	}
	return nil, err
}
