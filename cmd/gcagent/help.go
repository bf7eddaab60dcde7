package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Help is kubectl's and crictl's: -h or --help (or `gcagent help CMD`)
// prints on standard output the command's usage line, what it does, its
// subcommands, its own flags, then the flags it takes from run, one block
// per area (image GC, container GC, NATS, ...), and how the environment
// sets them. Hidden flags (accepted, not read) and deprecated ones are not
// listed.

const envAll = `Environment and config file: each flag listed under an area (General, Image GC,
...) is also read from GCAGENT_<FLAG> (upper case, - as _:
GCAGENT_IMAGE_GC_HIGH_THRESHOLD=90; a repeatable flag takes a comma-separated
list: GCAGENT_KEEP_IMAGE=registry.k8s.io/*,*/critical:*) and from a
"flag-name = value" line of the --config file (or GCAGENT_CONFIG), one line
per value of a repeatable flag. A flag wins over the environment, the
environment over the file, the file over the kubelet's config
(--kubelet-config). An unknown GCAGENT_ variable or file key is an error.
Percents may end in %; sizes take B, KiB, MiB, GiB (or KB, MB, GB); durations
need a unit (90s, 5m, 2h).`

// envShared is the environment paragraph of the tools that take some of
// run's areas: printHelp names those the command lists (sharedEnv).
const envShared = "gcagent.env.shared"

// sharedEnv is envShared's paragraph for a command whose flags of run's
// areas are in blocks: it names those areas and one of their variables.
func sharedEnv(blocks []flagBlock) string {
	var areas []string
	example := ""
	for _, b := range blocks {
		if b.title == "Flags" || b.title == agent.GeneralFlags.Title+" flags" {
			continue
		}
		areas = append(areas, strings.TrimSuffix(b.title, " flags"))
		if example == "" {
			b.flags.VisitAll(func(f *pflag.Flag) {
				if example == "" && !f.Hidden {
					example = envName(f.Name)
				}
			})
		}
	}
	if len(areas) == 0 {
		return ""
	}
	where := "the area " + areas[0]
	if len(areas) > 1 {
		where = "an area (" + strings.Join(areas, ", ") + ")"
	}
	return wrap("Environment and config file: each flag listed under "+where+" is also read from GCAGENT_<FLAG> (upper case, - as _: "+
		example+") and from the --config file (run's), as the agent reads them; a flag wins over the environment, the environment over "+
		"the file. An unknown GCAGENT_ variable or file key is an error.", 80)
}

// wrap breaks s into lines of at most width bytes, between words.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(s) {
		switch {
		case n == 0:
		case n+1+len(w) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

// envAnnotation holds the environment paragraph of a command's help.
const envAnnotation = "gcagent.env"

func setEnvHelp(cmd *cobra.Command, text string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[envAnnotation] = text
	cmd.Flags().SortFlags = false
}

// helpWidth is the width help wraps flag descriptions to.
const helpWidth = 100

// printHelp writes cmd's help to w.
func printHelp(w io.Writer, cmd *cobra.Command) {
	use := cmd.UseLine()
	if !cmd.HasParent() {
		use = cmd.Name() + " <command> [flags]"
	}
	fmt.Fprintf(w, "Usage:\n  %s\n", strings.ReplaceAll(use, "\n", "\n  "))
	if about := cmd.Long; about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(about, "\n"))
	}
	var subs []*cobra.Command
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() && s.Name() != "help" {
			subs = append(subs, s)
		}
	}
	if len(subs) > 0 {
		fmt.Fprintln(w, "\nCommands:")
		width := 0
		for _, s := range subs {
			width = max(width, len(s.Name()))
		}
		for _, s := range subs {
			fmt.Fprintf(w, "  %-*s  %s\n", width, s.Name(), s.Short)
		}
	}
	blocks := flagBlocks(cmd)
	for _, g := range blocks {
		if usage := g.flags.FlagUsagesWrapped(helpWidth); usage != "" {
			fmt.Fprintf(w, "\n%s:\n%s", g.title, usage)
		}
	}
	env := cmd.Annotations[envAnnotation]
	if env == envShared {
		env = sharedEnv(blocks)
	}
	if env != "" {
		fmt.Fprintf(w, "\n%s\n", env)
	}
	if len(subs) > 0 {
		fmt.Fprintf(w, "\nUse \"%s <command> -h\" for a command's flags.\n", cmd.CommandPath())
	}
}

type flagBlock struct {
	title string
	flags *pflag.FlagSet
}

// flagBlocks are cmd's flags by area, in order: its own flags, then run's
// areas in the order they were added. -h, --help goes without saying.
func flagBlocks(cmd *cobra.Command) []flagBlock {
	own := flagBlock{"Flags", pflag.NewFlagSet("", pflag.ContinueOnError)}
	own.flags.SortFlags = false
	blocks := []flagBlock{own}
	add := func(f *pflag.Flag) {
		if f.Name == "help" || f.Hidden {
			return
		}
		title := "Flags"
		if t := f.Annotations[agent.GroupAnnotation]; len(t) > 0 {
			title = t[0] + " flags"
		}
		i := slices.IndexFunc(blocks, func(b flagBlock) bool { return b.title == title })
		if i < 0 {
			fs := pflag.NewFlagSet("", pflag.ContinueOnError)
			fs.SortFlags = false
			blocks = append(blocks, flagBlock{title, fs})
			i = len(blocks) - 1
		}
		if blocks[i].flags.Lookup(f.Name) == nil {
			blocks[i].flags.AddFlag(f)
		}
	}
	cmd.LocalFlags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	return blocks
}
