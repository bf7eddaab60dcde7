package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// clusterUsage is --cluster's help, by tool.
var clusterUsage = map[string]string{
	"ctl":   "cluster of the node(s) to ask",
	"watch": "cluster to show, or * for every cluster",
	"keep":  "cluster whose keep list to change (ls: whose lists to show)",
}

// addNATSClientFlags adds to a NATS tool the NATS flags it shares with run
// and --state-dir, bound to cfg: like the agent, they also read
// GCAGENT_<FLAG>.
func addNATSClientFlags(cmd *cobra.Command, cfg *agent.Config) {
	fs := cmd.Flags()
	addConfigFlag(cmd, cfg)
	agent.NATSClientFlags.AddTo(fs, cfg)
	agent.StateFlags.AddTo(fs, cfg, "state-dir")
	fs.Lookup("cluster").Usage = clusterUsage[cmd.Name()]
	fs.Lookup("nats-url").Usage = "NATS server URLs, comma separated (empty: the local agent's embedded server)"
	fs.Lookup("state-dir").Usage = "the local agent's state dir: without --nats-url, the embedded NATS server's URL and credentials are read from it"
}

// addConfigFlag adds run's --config to a tool that takes some of run's
// flags: the settings the agent runs with, written once in its file, reach
// the tool too (status's --metrics-address, watch's --state-dir).
func addConfigFlag(cmd *cobra.Command, cfg *agent.Config) {
	agent.GeneralFlags.AddTo(cmd.Flags(), cfg, "config")
	cmd.Flags().Lookup("config").Usage = "run's settings `file`: the settings of the areas below are read from it too (flags and environment win)"
}

// natsTarget is the server a NATS client tool talks to, to say so when
// nothing answers there.
type natsTarget struct {
	// local: the local agent's embedded server, found through --state-dir
	// (no --nats-url and no credentials given).
	local    bool
	stateDir string
	url      string // redacted
	noURL    bool   // local, but the state dir names no URL (no agent runs there, or its server's address is not bound)
}

// hint is what to check when nothing answers.
func (t natsTarget) hint() string {
	switch {
	case t.noURL:
		return fmt.Sprintf(": no agent listens for local tools with --state-dir %s (no %s there: none runs, or its embedded server cannot bind its address; gcagent check says which)", t.stateDir, natsbus.LocalURLFile)
	case t.local:
		return fmt.Sprintf(": is the agent running with --state-dir %s?", t.stateDir)
	}
	return ""
}

// starting says err means the local agent has not made its streams yet:
// it makes them at start (unless --nats-no-create-stream).
func (t natsTarget) starting(err error) bool {
	return t.local && !t.noURL && errors.Is(err, jetstream.ErrStreamNotFound)
}

// noAgent is the error of a tool that reached no agent on t.
func (t natsTarget) noAgent(cause error) error {
	return fmt.Errorf("no agent answers on %s (%v)%s", t.url, cause, t.hint())
}

// connectTool connects a tool to t as cfg says; it fails at once, naming
// the URL, when no server answers there.
func connectTool(cfg agent.Config, t natsTarget) (*nats.Conn, error) {
	o := cfg.ConnOptions()
	o.FailFast = true
	nc, err := natsbus.Connect(o)
	if err != nil {
		cause := errors.Unwrap(err) // natsbus's prefix says nothing here
		if cause == nil {
			cause = err
		}
		return nil, t.noAgent(cause)
	}
	return nc, nil
}

// natsTool settles a NATS tool's flags (those shared with run also from
// GCAGENT_<FLAG>) and finds its server: --nats-url, or the local agent's
// embedded server through --state-dir. The connection is named
// gcagent/<cluster>/<tool>@<host>, which control requests carry as their
// caller.
func (c *cli) natsTool(cmd *cobra.Command, cfg *agent.Config) (natsTarget, error) {
	var target natsTarget
	if _, err := c.settle(cmd.Flags()); err != nil {
		return target, err
	}
	if cfg.NATSURL == "" && !cfg.HasNATSAuth() {
		// The local agent's embedded server: its URL and credentials are in
		// its state dir.
		url, seed, err := natsbus.LocalClient(cfg.StateDir)
		if err != nil {
			return target, fmt.Errorf("%v (give --nats-url and credentials, or run as the agent's user)", err)
		}
		cfg.NATSURL, cfg.NATSNKey = url, seed
		target = natsTarget{local: true, stateDir: cfg.StateDir, noURL: url == ""}
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://" + agent.DefaultConfig().EmbeddedNATSListen
	}
	target.url = natsbus.RedactURL(cfg.NATSURL)
	host, _ := os.Hostname()
	cfg.NodeName = cmd.Name() + "@" + host
	if err := cfg.ConnOptions().Validate(); err != nil {
		return target, usagef("invalid NATS settings: %v", err)
	}
	return target, nil
}
