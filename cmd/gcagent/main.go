// Command gcagent is an event-sourced garbage collector for containerd
// nodes: it follows containerd's events, keeps a persisted projection of
// images, containers and pods, and cleans what its policy names.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/natsbus"
)

// usageError is a bad command line: exit status 2, one line.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }

const usage = `usage: gcagent <command> [flags]

commands:
  run       run the agent (gcagent run -h for flags)
  plan      one-shot dry run: what GC would delete now and why (run's flags, --json)
  status    print a running agent's projection (--address, --json)
  watch     live fleet view from NATS (--nats-url, --cluster, --since, --json; without
            --nats-url: the local agent's embedded server, credentials from --state-dir)
  ctl       send a control request over NATS (status, plan, explain, gc; same local default)
  version   print the version, commit and Go version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	var ue usageError
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "gcagent: %v\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "gcagent: %v\n", err)
		os.Exit(1)
	}
}

func dispatch(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("no command given")}
	}
	switch args[0] {
	case "run":
		cfg, err := parseRun(args[1:], env, stderr)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usageError{err}
		}
		return agent.Run(ctx, cfg, stderr)
	case "plan":
		return planCmd(ctx, args[1:], env, stdout, stderr)
	case "status":
		return status(ctx, args[1:], stdout, stderr)
	case "watch":
		return watch(ctx, args[1:], env, stdout, stderr)
	case "ctl":
		return ctl(ctx, args[1:], env, stdout, stderr)
	case "version":
		embedded := "with"
		if !natsbus.EmbeddedBuilt {
			embedded = "without"
		}
		fmt.Fprintf(stdout, "gcagent %s commit %s %s, %s the embedded NATS server\n", version.Version, version.Commit, runtime.Version(), embedded)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return usageError{fmt.Errorf("unknown command %q (run, plan, status, watch, ctl, version)", args[0])}
}
