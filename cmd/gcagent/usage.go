package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
)

// help is what a subcommand's -h and --help print, on standard output: its
// own usage line, what it does, its own flags, and how the environment sets
// them.
type help struct {
	// Usage is the synopsis, e.g. "gcagent ctl [flags] status|plan|explain|gc".
	Usage string
	// About says in a few lines what the command does.
	About string
	// Env says which flags also read GCAGENT_<FLAG>: "all" (run, plan) or
	// "shared" (the NATS client flags and --state-dir).
	Env string
}

const envAll = `Environment and config file: every flag is also read from GCAGENT_<FLAG>
(upper case, - as _: GCAGENT_IMAGE_GC_HIGH_THRESHOLD=90) and from a
"flag-name = value" line of the --config file (or GCAGENT_CONFIG). A flag
wins over the environment, the environment over the file. An unknown
GCAGENT_ variable or file key is an error. Sizes take B, KiB, MiB, GiB
(or KB, MB, GB); durations need a unit (90s, 5m, 2h).
`

const envShared = `Environment: the NATS flags and --state-dir are also read from GCAGENT_<FLAG>
(upper case, - as _: GCAGENT_NATS_URL), as the agent reads them; a flag wins.
An unknown GCAGENT_ variable is an error.
`

// print writes the help for fs to w.
func (h help) print(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\nflags:\n", h.Usage, strings.TrimRight(h.About, "\n")+"\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	switch h.Env {
	case "all":
		fmt.Fprint(w, "\n"+envAll)
	case "shared":
		fmt.Fprint(w, "\n"+envShared)
	}
}

// newFlagSet returns a flag set that prints nothing by itself: a bad flag is
// one line (parseFlags), help goes to standard output.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args into fs. -h and --help print h to stdout and
// return flag.ErrHelp (exit status 0); any other error is a usage error of
// one line (exit status 2). Arguments after the flags are refused unless
// the command takes them (args > 0).
func parseFlags(fs *flag.FlagSet, args []string, h help, stdout io.Writer, maxArgs int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			h.print(stdout, fs)
			return err
		}
		return usageError{fmt.Errorf("%s: %v", fs.Name(), err)}
	}
	if fs.NArg() > maxArgs {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(maxArgs))}
	}
	return nil
}

// checkEnviron refuses an unknown GCAGENT_ variable: a typo in a
// DaemonSet's ConfigMap would otherwise quietly run with the default.
// Variables under GCAGENT_TEST_ belong to the test harness and are ignored.
func checkEnviron(environ []string) error {
	known := knownEnv()
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "GCAGENT_") || strings.HasPrefix(name, "GCAGENT_TEST_") || slices.Contains(known, name) {
			continue
		}
		return fmt.Errorf("unknown environment variable %s (did you mean %s?)", name, nearest(name, known))
	}
	return nil
}

// knownEnv lists every GCAGENT_ variable a command reads.
func knownEnv() []string {
	known := []string{"GCAGENT_CONFIG"}
	runFlags("run", &agent.Config{}).VisitAll(func(f *flag.Flag) {
		if f.Name != "config" {
			known = append(known, envName(f.Name))
		}
	})
	return known
}

// nearest returns the candidate with the smallest edit distance to s.
func nearest(s string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range candidates {
		if d := editDistance(s, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is Levenshtein's distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
