package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Where a setting comes from, by precedence: a flag, then GCAGENT_<FLAG>,
// then a line of the config file (--config), then the kubelet's config
// (--kubelet-config, image GC only), then the default. Only the flags of
// run's areas (agent.FlagGroup) read the environment and the file; a
// command's own flags (--json, --since, ...) never do.

// settleRun settles cmd's flags into cfg, adopts the kubelet's values and
// validates: what run, plan and check do before anything else.
func (c *cli) settleRun(cmd *cobra.Command, cfg *agent.Config) error {
	sources, err := c.settle(cmd.Flags())
	if err != nil {
		return err
	}
	cfg.Sources = sources
	// The kubelet's values fill what no flag, variable or file line set.
	if err := cfg.AdoptKubelet(); err != nil {
		return usageError{err}
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	return nil
}

// settle fills the flags of fs that were not given from the environment
// and, when fs has --config, from the config file, and says where each
// setting came from ("flag", "env GCAGENT_X", "file PATH:LINE"). An
// unknown GCAGENT_ variable or file key is a usage error.
func (c *cli) settle(fs *pflag.FlagSet) (map[string]string, error) {
	if err := checkEnviron(c.environ); err != nil {
		return nil, usageError{err}
	}
	sources := map[string]string{}
	fs.Visit(func(f *pflag.Flag) { sources[f.Name] = "flag" })
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		v := c.env(envName(f.Name))
		if err != nil || v == "" || sources[f.Name] != "" || !readsSettings(f) {
			return
		}
		if err = setFlag(fs, f.Name, v, envName(f.Name)); err == nil {
			sources[f.Name] = "env " + envName(f.Name)
		}
	})
	if err != nil {
		return nil, usageError{err}
	}
	file := ""
	if f := fs.Lookup("config"); f != nil {
		file = f.Value.String()
	}
	if file == "" {
		return sources, nil
	}
	kv, err := readConfigFile(file)
	if err != nil {
		return nil, usageError{err}
	}
	known := runSettings()
	for _, e := range kv {
		from := fmt.Sprintf("%s:%d", file, e.line)
		switch f := fs.Lookup(e.name); {
		case e.name == "config":
			return nil, usagef("%s: a config file cannot name another (config)", from)
		case !slices.Contains(known, e.name):
			hint := didYouMean(e.name, known)
			if hint == "" {
				hint = " (the keys are the flags of gcagent run, without --)"
			}
			return nil, usagef("%s: unknown setting %q%s", from, e.name, hint)
		case f == nil || !readsSettings(f):
			// A setting of run this command does not take.
		case sources[e.name] != "":
			// A flag or variable wins.
		default:
			if err := setFlag(fs, e.name, e.value, from); err != nil {
				return nil, usageError{err}
			}
			sources[e.name] = "file " + from
		}
	}
	return sources, nil
}

// readsSettings says whether f is one of run's settings, which also come
// from the environment and the config file.
func readsSettings(f *pflag.Flag) bool {
	_, ok := f.Annotations[agent.GroupAnnotation]
	return ok
}

// setFlag sets flag name to value from a variable or file line.
func setFlag(fs *pflag.FlagSet, name, value, from string) error {
	if err := fs.Lookup(name).Value.Set(value); err != nil {
		return fmt.Errorf("%s: invalid value %q for --%s: %v", from, value, name, err)
	}
	return nil
}

func envName(flagName string) string {
	return "GCAGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// runSettings are the names of run's flags: the keys of a config file.
func runSettings() []string {
	var names []string
	for _, g := range agent.RunFlags {
		names = append(names, g.Names()...)
	}
	return names
}

// checkEnviron refuses an unknown GCAGENT_ variable: a typo in a
// DaemonSet's ConfigMap would otherwise quietly run with the default.
// Variables under GCAGENT_TEST_ belong to the test harness and are ignored.
func checkEnviron(environ []string) error {
	var known []string
	for _, n := range runSettings() {
		known = append(known, envName(n))
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "GCAGENT_") || strings.HasPrefix(name, "GCAGENT_TEST_") || slices.Contains(known, name) {
			continue
		}
		hint := didYouMean(name, known)
		if hint == "" {
			hint = " (each flag of gcagent run reads GCAGENT_<FLAG>)"
		}
		return fmt.Errorf("unknown environment variable %s%s", name, hint)
	}
	return nil
}

// setting is one `name = value` line of a config file.
type setting struct {
	name, value string
	line        int
}

// readConfigFile reads `name = value` lines; # starts a comment.
func readConfigFile(file string) ([]setting, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	var out []setting
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("config %s:%d: want name = value", file, n)
		}
		out = append(out, setting{strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`), n})
	}
	return out, sc.Err()
}
