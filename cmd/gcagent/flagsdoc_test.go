package main

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// flagsDoc is the complete table of run's flags.
const flagsDoc = "../../docs/flags.md"

// documentedFlags reads doc: for each flag named (as `--name`) in the first
// cell of a table row, the "## " heading it is listed under.
func documentedFlags(t *testing.T, doc string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	flagName := regexp.MustCompile("`--([a-z0-9-]+)`")
	out := map[string][]string{}
	heading, fence := "", false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			fence = !fence
		case fence:
		case strings.HasPrefix(line, "## "):
			heading = strings.TrimSpace(strings.TrimPrefix(line, "## "))
		case strings.HasPrefix(line, "| `--"):
			first := strings.Split(line, "|")[1]
			for _, m := range flagName.FindAllStringSubmatch(first, -1) {
				out[m[1]] = append(out[m[1]], heading)
			}
		}
	}
	return out
}

// TestFlagsDocumented: docs/flags.md lists every flag of `gcagent run`
// once, under the heading of the area `gcagent run -h` prints it under,
// and no flag run does not have.
func TestFlagsDocumented(t *testing.T) {
	doc := documentedFlags(t, flagsDoc)
	run := (&cli{}).runCmd()
	seen := map[string]bool{}
	for _, b := range flagBlocks(run) {
		b.flags.VisitAll(func(f *pflag.Flag) {
			seen[f.Name] = true
			switch where := doc[f.Name]; {
			case len(where) == 0:
				t.Errorf("%s: --%s (%s) is not documented", flagsDoc, f.Name, b.title)
			case len(where) > 1:
				t.Errorf("%s: --%s is listed %d times (%s)", flagsDoc, f.Name, len(where), strings.Join(where, ", "))
			case where[0] != b.title:
				t.Errorf("%s: --%s is listed under %q; run -h lists it under %q", flagsDoc, f.Name, where[0], b.title)
			}
		})
	}
	if len(seen) < 40 {
		t.Fatalf("run has %d flags: the command was not built as the binary builds it", len(seen))
	}
	for _, name := range slices.Sorted(maps.Keys(doc)) {
		if !seen[name] {
			t.Errorf("%s: --%s is documented but is not a flag of gcagent run", flagsDoc, name)
		}
	}
}

// TestREADMEFlagsExist: the flags the README's table of run's most
// important flags names are run's.
func TestREADMEFlagsExist(t *testing.T) {
	run := (&cli{}).runCmd()
	named := documentedFlags(t, "../../README.md")
	if len(named) == 0 {
		t.Fatal("README.md names no flag in a table")
	}
	for name := range named {
		if run.Flags().Lookup(name) == nil {
			t.Errorf("README.md: --%s is not a flag of gcagent run", name)
		}
	}
}
