package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats.go"
)

// clusterUsage is --cluster's help, by command.
var clusterUsage = map[string]string{
	"run":   "cluster name in NATS subjects and events",
	"plan":  "cluster name in NATS subjects and events",
	"ctl":   "cluster of the node(s) to ask",
	"watch": "cluster to show, or * for every cluster",
	"keep":  "cluster whose keep list to change (ls: whose lists to show)",
}

// natsClientFlags binds the flags a NATS client command shares with run.
func natsClientFlags(fs *flag.FlagSet, cfg *agent.Config) {
	fs.StringVar(&cfg.NATSURL, "nats-url", cfg.NATSURL, "NATS server URLs, comma separated (run: empty starts an embedded server)")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, clusterUsage[fs.Name()])
	fs.StringVar(&cfg.NATSCreds, "nats-creds", cfg.NATSCreds, "NATS credentials file")
	fs.StringVar(&cfg.NATSNKey, "nats-nkey", cfg.NATSNKey, "NATS nkey seed file")
	fs.StringVar(&cfg.NATSUser, "nats-user", cfg.NATSUser, "NATS user")
	fs.StringVar(&cfg.NATSPassword, "nats-password", cfg.NATSPassword, "NATS password")
	fs.StringVar(&cfg.NATSToken, "nats-token", cfg.NATSToken, "NATS token")
	fs.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", cfg.NATSTLSCA, "CA file for the NATS server certificate")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", cfg.NATSTLSCert, "client certificate for NATS mTLS")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", cfg.NATSTLSKey, "client key for NATS mTLS")
	fs.StringVar(&cfg.NATSStream, "nats-stream", cfg.NATSStream, "JetStream stream of events")
	fs.StringVar(&cfg.NATSJSDomain, "nats-js-domain", cfg.NATSJSDomain, "JetStream domain of the streams (on a leaf node: the hub's domain); empty: the server's own")
}

// localStateDirFlag binds --state-dir for a local NATS client: where it
// finds the local agent's embedded server URL and credentials.
func localStateDirFlag(fs *flag.FlagSet, cfg *agent.Config) {
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "the local agent's state dir: without --nats-url, the embedded NATS server's URL and credentials are read from it")
}

// natsTarget is the server a NATS client tool talks to, to say so when
// nothing answers there.
type natsTarget struct {
	// local: the local agent's embedded server, found through --state-dir
	// (no --nats-url and no credentials given).
	local    bool
	stateDir string
	url      string // redacted
	noURL    bool   // local, but the state dir names no URL (no agent ever ran there)
}

// hint is what to check when nothing answers.
func (t natsTarget) hint() string {
	switch {
	case t.noURL:
		return fmt.Sprintf(": no agent ever ran with --state-dir %s (no %s there)", t.stateDir, natsbus.LocalURLFile)
	case t.local:
		return fmt.Sprintf(": is the agent running with --state-dir %s?", t.stateDir)
	}
	return ""
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

// parseNATSClient parses a NATS client command's flags, then fills the ones
// not given from GCAGENT_<FLAG> like run does. The connection is named
// gcagent/<cluster>/<tool>@<host>, which control requests carry as their caller.
func parseNATSClient(fs *flag.FlagSet, cfg *agent.Config, args []string, env func(string) string, h help, stdout io.Writer) (natsTarget, error) {
	var target natsTarget
	tool := fs.Name()
	maxArgs := map[string]int{"ctl": 1, "keep": 2}[tool]
	if err := parseFlags(fs, args, h, stdout, maxArgs); err != nil {
		return target, err
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
		return target, usageError{err}
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
	cfg.NodeName = tool + "@" + host
	if err := cfg.ConnOptions().Validate(); err != nil {
		return target, usageError{fmt.Errorf("invalid NATS settings: %v", err)}
	}
	return target, nil
}
