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
	"strings"
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
  run       run the agent
  plan      what GC would delete now and why, and the policy in force (deletes nothing)
  check     preflight of this node: containerd, CRI, disks, log and state dirs, kubelet, NATS, clock
  status    print a running agent's projection
  watch     live fleet view from NATS
  ctl       send a control request over NATS (status, plan, explain, gc)
  ctl keep  change the fleet keep list in NATS (add, rm, ls)
  replay    what an image GC policy would have done over the node's usage trace
  trace     export the node's usage trace as JSON lines (trace export)
  version   print the version, commit and Go version

gcagent <command> -h shows a command's flags. Every flag of run is also read
from GCAGENT_<FLAG> (GCAGENT_IMAGE_GC_HIGH_THRESHOLD=90) and from --config.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
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

// dispatch runs the command args name with the environment environ
// (KEY=value). A usage error is one line and starts nothing.
func dispatch(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("no command given (run, plan, check, status, watch, ctl, replay, trace, version; gcagent -h for help)")}
	}
	env := lookupIn(environ)
	switch args[0] {
	case "run", "plan", "check", "status", "watch", "ctl", "replay", "trace":
		if err := checkEnviron(environ); err != nil {
			return usageError{err}
		}
	}
	switch args[0] {
	case "run":
		cfg, err := parseRun(args[1:], env, runHelp, stdout)
		if err != nil {
			return err
		}
		return agent.Run(ctx, cfg, stderr)
	case "plan":
		return planCmd(ctx, args[1:], env, stdout, stderr)
	case "check":
		return checkCmd(ctx, args[1:], env, stdout)
	case "status":
		return status(ctx, args[1:], env, stdout, stderr)
	case "watch":
		return watch(ctx, args[1:], env, stdout, stderr)
	case "ctl":
		if len(args) > 1 && args[1] == "keep" {
			return ctlKeep(ctx, args[2:], env, stdout)
		}
		return ctl(ctx, args[1:], env, stdout, stderr)
	case "replay":
		return replayCmd(ctx, args[1:], env, stdout, stderr)
	case "trace":
		return traceCmd(ctx, args[1:], env, stdout)
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
	return usageError{fmt.Errorf("unknown command %q (run, plan, check, status, watch, ctl, replay, trace, version)", args[0])}
}

// stdinReader is what --trace - reads.
var stdinReader io.Reader = os.Stdin

// lookupIn returns a lookup of environ (KEY=value); the last of a repeated
// key wins, as in getenv.
func lookupIn(environ []string) func(string) string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}
