package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/natsbus"
)

// clusterUsage is --cluster's help, by command.
var clusterUsage = map[string]string{
	"run":   "cluster name in NATS subjects and events",
	"plan":  "cluster name in NATS subjects and events",
	"ctl":   "cluster of the node(s) to ask",
	"watch": "cluster to show, or * for every cluster",
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
}

// localStateDirFlag binds --state-dir for a local NATS client: where it
// finds the local agent's embedded server URL and credentials.
func localStateDirFlag(fs *flag.FlagSet, cfg *agent.Config) {
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "the local agent's state dir: without --nats-url, the embedded NATS server's URL and credentials are read from it")
}

// parseNATSClient parses a NATS client command's flags, then fills the ones
// not given from GCAGENT_<FLAG> like run does. The connection is named
// gcagent/<cluster>/<tool>@<host>, which control requests carry as their caller.
func parseNATSClient(fs *flag.FlagSet, cfg *agent.Config, args []string, env func(string) string, h help, stdout io.Writer) error {
	tool := fs.Name()
	maxArgs := 0
	if tool == "ctl" {
		maxArgs = 1
	}
	if err := parseFlags(fs, args, h, stdout, maxArgs); err != nil {
		return err
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
