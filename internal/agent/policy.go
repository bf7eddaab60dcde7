package agent

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gcagent/gcagent/schema"
	"github.com/rs/zerolog"
)

// Setting is one setting in force: its flag name, its value and where it
// came from ("default", "flag", "env GCAGENT_X", "file PATH:LINE",
// "kubelet-config PATH").
type Setting = schema.Setting

// Policy lists the settings that decide what the agent deletes, in a
// fixed order, so that an operator can confirm which ones took effect: the
// start line, `gcagent plan` and /status show them.
func (c Config) Policy() []Setting {
	dur := func(d time.Duration) string { return d.String() }
	list := []struct{ name, value string }{
		{"image-gc-high-threshold", strconv.Itoa(c.ImageGCHighThreshold) + "%"},
		{"image-gc-low-threshold", strconv.Itoa(c.ImageGCLowThreshold) + "%"},
		{"minimum-image-ttl-duration", dur(c.MinimumImageTTL)},
		{"image-maximum-gc-age", dur(c.ImageMaximumGCAge)},
		{"keep-image", strings.Join(c.KeepImages, ",")},
		{"keep-list-wait", dur(c.KeepListWait)},
		{"sandbox-image", c.SandboxImage},
		{"namespace", c.Namespace},
		{"exclude-namespace", c.ExcludeNamespace},
		{"prune-containers", c.PruneContainers},
		{"minimum-container-ttl-duration", dur(c.MinimumContainerTTL)},
		{"maximum-dead-containers-per-container", strconv.Itoa(c.MaxDeadPerContainer)},
		{"maximum-dead-containers", strconv.Itoa(c.MaxDeadContainers)},
		{"pod-log-grace", dur(c.PodLogGrace)},
		{"kubelet-status-lag", dur(c.KubeletStatusLag)},
		{"host-pod-log-dir", c.HostPodLogDir},
		{"dry-run", strconv.FormatBool(c.DryRun)},
		{"kubelet-config", c.KubeletConfig},
	}
	out := make([]Setting, 0, len(list))
	for _, s := range list {
		src := c.Sources[s.name]
		if src == "" {
			src = "default"
		}
		out = append(out, Setting{Name: s.name, Value: s.value, Source: src})
	}
	return out
}

// policySettings are the settings in force (Config.Policy) plus the fleet
// keep list the agent applies and how old it is.
func (a *agent) policySettings() []Setting { return a.policyOf(a.cfg) }

// policyOf is policySettings with the settings of cfg.
func (a *agent) policyOf(cfg Config) []Setting {
	out := cfg.Policy()
	if a.keep != nil {
		out = append(out, a.keep.Setting(a.clock.Now()), a.keep.ClusterSetting(a.clock.Now()))
	}
	return out
}

// policyLog adds the policy to a log line: one field per setting, its value
// and, when not the default, where it came from.
func policyLog(e *zerolog.Event, policy []Setting) *zerolog.Event {
	d := zerolog.Dict()
	for _, s := range policy {
		v := s.Value
		if s.Source != "default" {
			v = fmt.Sprintf("%s (%s)", s.Value, s.Source)
		}
		d.Str(strings.ReplaceAll(s.Name, "-", "_"), v) // a log field is snake_case, as every other
	}
	return e.Dict("policy", d)
}
