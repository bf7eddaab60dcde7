package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gcagent/gcagent/internal/agent"
	"github.com/gcagent/gcagent/internal/suggest"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Where a setting comes from, by precedence: a flag, then GCAGENT_<FLAG>,
// then a line of the config file (--config), then the kubelet's config
// (--kubelet-config, image GC only), then the default. Only the flags of
// run's areas (agent.FlagGroup) read the environment and the file; a
// command's own flags (--json, --since, ...) never do.

// settleRun settles cmd's flags into cfg, adopts the kubelet's values and
// validates: what run and check do before anything else.
func (c *cli) settleRun(cmd *cobra.Command, cfg *agent.Config) error {
	_, err := c.settleConfig(cmd, cfg, false)
	return err
}

// settleWhatIf is settleRun for the commands that ask what a policy would
// do (plan, replay): a high threshold given alone takes down with it a low
// one not given that would exceed it (agent.Config.FollowHigh), where run
// refuses the pair; moved says what moved ("" when nothing did).
func (c *cli) settleWhatIf(cmd *cobra.Command, cfg *agent.Config) (moved string, err error) {
	return c.settleConfig(cmd, cfg, true)
}

func (c *cli) settleConfig(cmd *cobra.Command, cfg *agent.Config, whatIf bool) (moved string, err error) {
	sources, err := c.settle(cmd.Flags())
	if err != nil {
		return "", err
	}
	cfg.Sources = sources
	// The kubelet's values fill what no flag, variable or file line set.
	if err := cfg.AdoptKubelet(); err != nil {
		return "", usageError{err}
	}
	if whatIf {
		moved = cfg.FollowHigh()
	}
	if err := cfg.Validate(); err != nil {
		return "", usageError{err}
	}
	return moved, nil
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
		if err = setEnvFlag(fs, f, v); err == nil {
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
	firstLine := map[string]int{} // the file's line that set each key first
	for _, e := range kv {
		from := fmt.Sprintf("%s:%d", file, e.line)
		f := fs.Lookup(e.name)
		repeatable := slices.Contains(repeatableSettings(), e.name) // as run takes it, whether this command does or not
		switch {
		case e.name == "config":
			return nil, usagef("%s: a config file cannot name another (config)", from)
		case !slices.Contains(known, e.name):
			hint := suggest.DidYouMean(e.name, known)
			if hint == "" {
				hint = " (the keys are the flags of gcagent run, without --)"
			}
			return nil, usagef("%s: unknown setting %q%s", from, e.name, hint)
		case firstLine[e.name] > 0 && !repeatable:
			// First-wins or last-wins would each quietly drop a line.
			return nil, usagef("%s: %s is set again (first on line %d): a setting takes one line, a repeatable one (keep-image) one line per value",
				from, e.name, firstLine[e.name])
		}
		first := firstLine[e.name]
		if first == 0 {
			firstLine[e.name] = e.line
		}
		switch {
		case f == nil || !readsSettings(f):
			// A setting of run this command does not take.
		case sources[e.name] != "" && first == 0:
			// A flag or variable wins (a repeatable one: all its lines).
		case first > 0 && !strings.HasPrefix(sources[e.name], "file "):
			// A later line of a repeatable setting a flag or variable gave.
		default:
			if err := setFlag(fs, e.name, e.value, from); err != nil {
				return nil, usageError{err}
			}
			if first == 0 {
				sources[e.name] = "file " + from
			} else {
				sources[e.name] += fmt.Sprintf(",%d", e.line) // file PATH:2,5: every line of a repeatable setting
			}
		}
	}
	return sources, nil
}

// repeatableSettings are the names of run's repeatable flags
// (keep-image): a config file gives one line per value.
func repeatableSettings() []string {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	var cfg agent.Config
	for _, g := range agent.RunFlags {
		g.AddTo(fs, &cfg)
	}
	var out []string
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := f.Value.(pflag.SliceValue); ok {
			out = append(out, f.Name)
		}
	})
	return out
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

// setEnvFlag sets flag f from its variable's value v: a repeatable flag
// (--keep-image) takes a comma-separated list there, one value per item
// (an image name holds no comma, so a glob with one would match nothing).
func setEnvFlag(fs *pflag.FlagSet, f *pflag.Flag, v string) error {
	if _, ok := f.Value.(pflag.SliceValue); !ok {
		return setFlag(fs, f.Name, v, envName(f.Name))
	}
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		if err := setFlag(fs, f.Name, item, envName(f.Name)); err != nil {
			return err
		}
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
		hint := suggest.DidYouMean(name, known)
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

// readConfigFile reads `name = value` lines; a line that starts with #
// is a comment. A value wholly in one pair of double or single quotes is
// taken without them (`keep-image = "registry.test/*"`, as systemd's
// EnvironmentFile and YAML read it); a quote at one end only is an error.
// Errors start with PATH: or PATH:LINE:, as every error about the file.
func readConfigFile(file string) ([]setting, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot read the config file (--config): %w", file, unwrapPath(err))
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
			return nil, fmt.Errorf("%s:%d: want name = value", file, n)
		}
		v, err := unquote(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %v", file, n, strings.TrimSpace(k), err)
		}
		out = append(out, setting{strings.TrimSpace(k), v, n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: cannot read the config file (--config): %w", file, unwrapPath(err))
	}
	return out, nil
}

// unquote takes v out of one pair of matching quotes; a quote at one end
// only is an error.
func unquote(v string) (string, error) {
	for _, q := range []string{`"`, `'`} {
		starts, ends := strings.HasPrefix(v, q), strings.HasSuffix(v, q) && len(v) > 1
		switch {
		case starts && ends:
			return v[1 : len(v)-1], nil
		case starts || ends:
			return "", fmt.Errorf("value %s has an unmatched quote", v)
		}
	}
	return v, nil
}

// unwrapPath drops an *os.PathError's op and path, which the message
// already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
