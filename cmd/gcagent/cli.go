package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/suggest"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// usageError is a bad command line, variable or config file: exit status
// 2, one line, nothing started.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// exitCode is the exit status for err: 2 for a usage error, else 1.
func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// cli is what every command reads besides its flags: the environment and
// where to print.
type cli struct {
	environ        []string
	env            func(string) string
	stdout, stderr io.Writer
	// stdin is what --trace - reads: os.Stdin.
	stdin io.Reader
	// runAgent runs the agent with a settled config: agent.Run.
	runAgent func(ctx context.Context, cfg agent.Config, logOut io.Writer) error
}

// execute runs the command line args with the environment environ
// (KEY=value). A usage error is one line and starts nothing.
func execute(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	c := &cli{environ: environ, env: lookupIn(environ), stdout: stdout, stderr: stderr, stdin: os.Stdin, runAgent: agent.Run}
	return c.execute(ctx, args)
}

func (c *cli) execute(ctx context.Context, args []string) error {
	root := c.root()
	root.SetArgs(args)
	if len(args) == 0 {
		return usagef("no command given (gcagent -h lists them)")
	}
	return root.ExecuteContext(ctx)
}

// root is the command tree: `gcagent <command> [flags]`.
func (c *cli) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "gcagent",
		Short: "event-sourced garbage collector for containerd nodes",
		Long: "gcagent follows containerd's events, keeps a persisted projection of images,\n" +
			"containers and pods, and cleans what its policy names: images (as the kubelet's\n" +
			"image GC does), dead containers and the kubelet's container logs. Every action\n" +
			"is published to NATS.",
		Version:           versionLine(),
		Args:              unknownCommand,
		RunE:              func(*cobra.Command, []string) error { return usagef("no command given (gcagent -h lists them)") },
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.Flags().BoolP("version", "v", false, "print the version, commit and Go version")
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetFlagErrorFunc(flagError)
	root.SetHelpFunc(func(cmd *cobra.Command, _ []string) { printHelp(cmd.OutOrStdout(), cmd) })
	root.AddCommand(c.runCmd(), c.planCmd(), c.checkCmd(), c.statusCmd(), c.watchCmd(), c.ctlCmd(), c.replayCmd(), c.traceCmd(), versionCmd())
	return root
}

func versionLine() string {
	embedded := "with"
	if !natsbus.EmbeddedBuilt {
		embedded = "without"
	}
	return fmt.Sprintf("gcagent %s commit %s %s, %s the embedded NATS server", version.Version, version.Commit, runtime.Version(), embedded)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version, commit and Go version (also gcagent --version)",
		Long: "Prints the version and commit (stamped with -ldflags at build), the Go version,\n" +
			"and whether the embedded NATS server is built in.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	}
}

// runCmd is `gcagent run`: the daemon.
func (c *cli) runCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "run the agent",
		Long: "Runs the agent: follows containerd's events, keeps the persisted projection of\n" +
			"images, containers and pods, and cleans what its policy names.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.settleRun(cmd, &cfg); err != nil {
				return err
			}
			return c.runAgent(cmd.Context(), cfg, c.stderr)
		},
	}
	for _, g := range agent.RunFlags {
		g.AddTo(cmd.Flags(), &cfg)
	}
	setEnvHelp(cmd, envAll)
	return cmd
}

// noArgs refuses positional arguments: one line, exit status 2.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%sunexpected argument %q", where(cmd), args[0])
	}
	return nil
}

// unknownCommand refuses an argument that names no subcommand of cmd,
// suggesting the nearest.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	hint := suggest.DidYouMean(args[0], names)
	if hint == "" {
		hint = " (" + cmd.CommandPath() + " -h lists them)"
	}
	return usagef("unknown command %q for %s%s", args[0], cmd.CommandPath(), hint)
}

// flagError makes a flag error one line that names the flag, with the
// nearest flag of the command when the name is unknown, or else the
// command that has it.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		if rest, ok := strings.CutPrefix(msg, "unknown shorthand flag: "); ok {
			typed := rest[strings.LastIndex(rest, " ")+1:]
			msg = "unknown flag " + typed
			// Go's flag package takes one dash: -image-gc-high-threshold.
			long, _, _ := strings.Cut(strings.TrimPrefix(typed, "-"), "=")
			if f := cmd.Flags().Lookup(long); f != nil && len(long) > 1 {
				msg += " (flags take two dashes: --" + long + ")"
			}
		}
		return usagef("%s%s", where(cmd), msg)
	}
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Deprecated == "" && f.Name != "help" {
			names = append(names, "--"+f.Name)
		}
	})
	hint := suggest.DidYouMean("--"+name, names)
	if hint == "" {
		if others := commandsWithFlag(cmd.Root(), name); len(others) > 0 {
			hint = " (a flag of " + strings.Join(others, ", ") + ")"
		} else {
			hint = " (" + cmd.CommandPath() + " -h lists the flags)"
		}
	}
	return usagef("%sunknown flag --%s%s", where(cmd), name, hint)
}

// commandsWithFlag lists the commands under root that show flag name.
func commandsWithFlag(root *cobra.Command, name string) []string {
	var out []string
	if f := root.Flags().Lookup(name); f != nil && !f.Hidden {
		out = append(out, strings.TrimSuffix(where(root), ": "))
	}
	for _, s := range root.Commands() {
		out = append(out, commandsWithFlag(s, name)...)
	}
	return out
}

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

// where prefixes a command's errors with its path below gcagent ("ctl
// keep: "); main prefixes "gcagent: ".
func where(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return ""
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ") + ": "
}
