package logs

import (
	"fmt"
	"slices"
)

// Problems says, one line each, why the last pass of Clean kept links it
// could not judge (targets outside the pod log dir the agent sees, or no
// pod log dir at all while CRI containers run); nil when there is nothing
// to say. GC goes on meanwhile: /readyz shows the lines as details, and
// `gcagent check` can show them. Safe for concurrent use.
func (c *Cleaner) Problems() []string {
	if p := c.last.Load(); p != nil {
		return slices.Clone(p.Problems)
	}
	return nil
}

// problems words what p keeps because the agent cannot judge it.
func (c *Cleaner) problems(p Plan) []string {
	n, first := unverifiable(p)
	blind := 0
	for _, d := range p.Decisions {
		if d.Reason == ReasonNoPodLogDir {
			blind++
		}
	}
	var out []string
	if line := c.unverifiedProblem(p); line != "" {
		out = append(out, line)
	}
	if n > 0 {
		where := "--pod-log-dir " + c.cfg.PodLogDir
		if c.cfg.HostPodLogDir != "" && c.cfg.HostPodLogDir != c.cfg.PodLogDir {
			where = "--host-pod-log-dir " + c.cfg.HostPodLogDir + " (seen at --pod-log-dir " + c.cfg.PodLogDir + ")"
		}
		out = append(out, fmt.Sprintf("%d log links kept unverified: their targets lie outside %s, e.g. %s: %s; "+
			"set --host-pod-log-dir to the pod log dir's path on the host", n, where, c.path(first), first.Detail))
	}
	if blind > 0 {
		out = append(out, fmt.Sprintf("%d log links kept: --pod-log-dir %s is missing or empty while CRI containers run",
			blind, c.cfg.PodLogDir))
	}
	return out
}

// unverifiable counts the links p keeps as unverifiable and returns the
// first.
func unverifiable(p Plan) (n int, first Decision) {
	for _, d := range p.Decisions {
		if d.Reason == ReasonTargetUnverifiable {
			if n == 0 {
				first = d
			}
			n++
		}
	}
	return n, first
}

// sayUnverifiable logs once, when links start being kept as unverifiable,
// how many and why, and once when none is any more: not a line per link
// per pass. The caller holds c.mu.
func (c *Cleaner) sayUnverifiable(p Plan) {
	n, first := unverifiable(p)
	switch {
	case n > 0 && !c.unverifiableSaid:
		c.unverifiableSaid = true
		c.log.Warn().Int("links", n).Str("path", c.path(first)).Str("reason", string(ReasonTargetUnverifiable)).
			Str("detail", first.Detail).Str("pod_log_dir", c.cfg.PodLogDir).Str("host_pod_log_dir", c.cfg.HostPodLogDir).
			Msg("log links kept: their targets lie outside the pod log dir the agent sees; " +
				"set --host-pod-log-dir to the pod log dir's path on the host")
	case n == 0 && c.unverifiableSaid:
		c.unverifiableSaid = false
		c.log.Info().Msg("no log link kept unverified any more")
	}
}
