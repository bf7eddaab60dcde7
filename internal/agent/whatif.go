package agent

import (
	"fmt"
	"maps"
	"net/url"
	"slices"

	"github.com/gcagent/gcagent/gc"
	"github.com/spf13/pflag"
)

// WhatIfSettings are the settings a plan of a running agent may change:
// what decides what goes, not where the agent looks. `gcagent plan
// --image-gc-high-threshold=70` asks the agent what it would delete with 70,
// from its own history, while it keeps running with its own policy.
var WhatIfSettings = []string{
	"image-gc-high-threshold", "image-gc-low-threshold", "minimum-image-ttl-duration", "image-maximum-gc-age",
	"keep-image", "sandbox-image",
	"prune-containers", "minimum-container-ttl-duration", "maximum-dead-containers-per-container",
	"maximum-dead-containers", "uncollected-exit-grace",
	"pod-log-grace", "host-pod-log-dir", "kubelet-status-lag",
}

// WithSettings returns c with set applied: flag name to values as the
// flags take them (a repeatable flag's values replace c's), and the names
// whose values changed, each with the source "what-if" and c's value. A
// setting outside WhatIfSettings may be given only with c's own value; the
// result must validate.
func (c Config) WithSettings(set url.Values) (Config, []string, error) {
	out := c
	out.KeepImages = slices.Clone(c.KeepImages)
	out.Sources = maps.Clone(c.Sources)
	if out.Sources == nil {
		out.Sources = map[string]string{}
	}
	fs := pflag.NewFlagSet("what-if", pflag.ContinueOnError)
	for _, g := range RunFlags {
		g.AddTo(fs, &out)
	}
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(set)) {
		values := set[name]
		f := fs.Lookup(name)
		if f == nil || name == "config" {
			return c, nil, fmt.Errorf("unknown setting %q", name)
		}
		before := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			if err := sv.Replace(values); err != nil {
				return c, nil, fmt.Errorf("invalid --%s %q: %v", name, values, err)
			}
		} else {
			if len(values) != 1 {
				return c, nil, fmt.Errorf("--%s takes one value, not %d", name, len(values))
			}
			if err := f.Value.Set(values[0]); err != nil {
				return c, nil, fmt.Errorf("invalid --%s %q: %v", name, values[0], err)
			}
		}
		if f.Value.String() == before {
			continue
		}
		if !slices.Contains(WhatIfSettings, name) {
			return c, nil, fmt.Errorf("--%s %s differs from the running agent's %s: a plan of a running agent can change only %v",
				name, f.Value.String(), before, WhatIfSettings)
		}
		changed = append(changed, name)
	}
	high, low := "image-gc-high-threshold", "image-gc-low-threshold"
	if slices.Contains(changed, high) && len(set[low]) == 0 && out.ImageGCLowThreshold > out.ImageGCHighThreshold {
		// The high threshold alone: the agent's low one follows it down,
		// as in replay (gc.LowFollowing), instead of a refused pair.
		out.ImageGCLowThreshold = gc.LowFollowing(c.ImageGCHighThreshold, c.ImageGCLowThreshold, out.ImageGCHighThreshold)
		changed = append(changed, low)
	}
	// An error names the what-if, not where the agent's own value came from.
	check := out
	check.Sources = maps.Clone(out.Sources)
	for name := range set {
		check.Sources[name] = "what-if"
	}
	if err := check.Validate(); err != nil {
		return c, nil, err
	}
	was := map[string]Setting{}
	for _, s := range c.Policy() {
		was[s.Name] = s
	}
	for _, name := range changed {
		src := "what-if"
		if s, ok := was[name]; ok {
			v := s.Value
			if v == "" {
				v = "-"
			}
			src = fmt.Sprintf("what-if; the agent's: %s (%s)", v, s.Source)
			if name == low && len(set[low]) == 0 {
				src = fmt.Sprintf("what-if, %s: the agent's %s (%s) would exceed it", MovedSource, v, s.Source)
			}
		}
		out.Sources[name] = src
	}
	return out, changed, nil
}

// SettingValues returns the values of the named settings as their flags
// take them (a repeatable flag's values one by one): the query of a
// what-if plan.
func (c Config) SettingValues(names []string) url.Values {
	fs := pflag.NewFlagSet("values", pflag.ContinueOnError)
	for _, g := range RunFlags {
		g.AddTo(fs, &c)
	}
	out := url.Values{}
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			out[name] = sv.GetSlice()
		} else {
			out[name] = []string{f.Value.String()}
		}
	}
	return out
}
