package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/kubeletconfig"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// kubeletTaken are the settings a kubelet config gives defaults for, in
// the order of Config.Policy.
var kubeletTaken = []string{"image-gc-high-threshold", "image-gc-low-threshold", "minimum-image-ttl-duration", "image-maximum-gc-age",
	"kubelet-status-lag"}

// AdoptKubelet reads KubeletConfig (when set) into Kubelet and takes its
// image GC settings as the defaults of those no flag, variable or file
// line set, recording "kubelet-config PATH" as their source: high and low
// threshold (imageGCHighThresholdPercent, imageGCLowThresholdPercent),
// minimum age (imageMinimumGCAge) and maximum age (imageMaximumGCAge), the
// kubelet's defaults applied where the file is silent. A kubelet high
// threshold of 100 is the handover (its image GC is off, README): its
// thresholds are then not taken, gcagent's stay in force. The kubelet's
// container GC settings are not in KubeletConfiguration (only the
// deprecated kubelet flags --minimum-container-ttl-duration,
// --maximum-dead-containers-per-container, --maximum-dead-containers), so
// there is nothing to take; its syncFrequency sets --kubelet-status-lag
// (twice it, at least 2m). An absent file is no error: nothing is taken
// (Kubelet stays nil), `check` warns, and a running agent follows the path
// until the file comes. An unreadable or invalid file (unknown field, wrong
// kind) is an error naming the flag and the file.
func (c *Config) AdoptKubelet() error {
	if c.KubeletConfig == "" {
		return nil
	}
	k, err := kubeletconfig.Read(c.KubeletConfig)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("%s: %v", c.KubeletConfig, pe.Err)
		}
		return fmt.Errorf("invalid --kubelet-config %v", err)
	}
	c.Kubelet = k
	c.adopt(k)
	return nil
}

// adopt takes k's image GC settings for those not given otherwise.
func (c *Config) adopt(k *kubeletconfig.Settings) {
	if c.Sources == nil {
		c.Sources = map[string]string{}
	}
	src := "kubelet-config " + c.KubeletConfig
	take := func(name string, set func()) {
		if _, given := c.Sources[name]; !given {
			set()
			c.Sources[name] = src
		}
	}
	if k.HighThreshold < 100 {
		take("image-gc-high-threshold", func() { c.ImageGCHighThreshold = k.HighThreshold })
		take("image-gc-low-threshold", func() { c.ImageGCLowThreshold = k.LowThreshold })
	}
	take("minimum-image-ttl-duration", func() { c.MinimumImageTTL = k.MinAge })
	take("image-maximum-gc-age", func() { c.ImageMaximumGCAge = k.MaxAge })
	// Its pod status lags up to 1.5 syncFrequency (the pod workers'
	// jitter); twice that, never less than the default.
	take("kubelet-status-lag", func() { c.KubeletStatusLag = max(gc.DefaultKubeletStatusLag, 2*k.SyncFrequency) })
}

// fromKubelet reports whether setting name came from the kubelet's config.
func (c Config) fromKubelet(name string) bool {
	return strings.HasPrefix(c.Sources[name], "kubelet-config ")
}

// nextStart is c as a start with k as the kubelet's config (nil: absent)
// would settle it: what c took from the kubelet's config is taken again
// from k, or is the default where k gives nothing (a handover's
// thresholds).
func (c Config) nextStart(k *kubeletconfig.Settings) Config {
	n := c
	n.Sources = maps.Clone(c.Sources)
	d := DefaultConfig()
	for _, name := range kubeletTaken {
		if !c.fromKubelet(name) {
			continue
		}
		delete(n.Sources, name)
		switch name {
		case "image-gc-high-threshold":
			n.ImageGCHighThreshold = d.ImageGCHighThreshold
		case "image-gc-low-threshold":
			n.ImageGCLowThreshold = d.ImageGCLowThreshold
		case "minimum-image-ttl-duration":
			n.MinimumImageTTL = d.MinimumImageTTL
		case "image-maximum-gc-age":
			n.ImageMaximumGCAge = d.ImageMaximumGCAge
		case "kubelet-status-lag":
			n.KubeletStatusLag = d.KubeletStatusLag
		}
	}
	if k != nil {
		n.adopt(k)
	}
	return n
}

// kubeletPollInterval is how often a running agent stats the kubelet's
// config file (one syscall; it is read only when it changed).
const kubeletPollInterval = 2 * time.Second

// kubeletFollower is the kubelet's config as a running agent follows it:
// read at start, then again whenever the file is rewritten, so that
// /readyz, the gauge gcagent_kubelet_image_gc_enabled and /plan's notes
// say what the kubelet's config says now (a handover is seen without a
// restart). The policy does not follow: the settings taken from the
// kubelet's config at start stay in force until the agent's next start,
// as the kubelet's own take effect only at its restart; a rewrite that
// changes them says so in one log line. Safe for concurrent use.
type kubeletFollower struct {
	file kubeletconfig.File
	// cfg is the agent's config at start: what it took.
	cfg Config
	// capacity is the image filesystem's size in bytes (0: unknown), to
	// judge eviction thresholds given as quantities.
	capacity func() uint64
	log      zerolog.Logger

	mu sync.Mutex
	// now is what the file said when last read; nil while never read.
	now *kubeletconfig.Settings
	// problem says why the file cannot be read since its last change; ""
	// while it can.
	problem string
}

func newKubeletFollower(cfg Config, capacity func() uint64, log zerolog.Logger) *kubeletFollower {
	k := &kubeletFollower{file: kubeletconfig.File{Path: cfg.KubeletConfig}, cfg: cfg, capacity: capacity, log: log, now: cfg.Kubelet}
	if cfg.Kubelet == nil {
		k.problem = absentAtStart(cfg.KubeletConfig) // the preflight's line says it at start
	}
	k.poll() // the first poll reads: silent when the file is as at start
	return k
}

func absentAtStart(path string) string {
	return path + " absent: nothing is known of the kubelet's image GC, nothing taken from it (is this where the kubelet keeps its config?)"
}

// current returns the settings last read (nil: never) and why the file
// cannot be read now ("" when it can).
func (k *kubeletFollower) current() (*kubeletconfig.Settings, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.now, k.problem
}

// notes are /readyz's kubelet lines: the file's problem, then the
// warnings about what it says against the agent's high threshold.
func (k *kubeletFollower) notes() []string {
	s, problem := k.current()
	var out []string
	if problem != "" {
		out = append(out, problem)
	}
	if s != nil {
		out = append(out, s.Notes(k.cfg.ImageGCHighThreshold, k.capacity())...)
	}
	return out
}

// run polls the file every kubeletPollInterval until ctx ends.
func (k *kubeletFollower) run(ctx context.Context) error {
	t := time.NewTicker(kubeletPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			k.poll()
		}
	}
}

// poll reads the file again when it changed, and says in one line what
// the change means for the kubelet's image GC and for this agent.
func (k *kubeletFollower) poll() {
	s, changed, err := k.file.Poll()
	if !changed {
		return
	}
	path := k.cfg.KubeletConfig
	k.mu.Lock()
	before, hadProblem := k.now, k.problem != ""
	switch {
	case errors.Is(err, fs.ErrNotExist) && before == nil:
		k.problem = absentAtStart(path)
	case errors.Is(err, fs.ErrNotExist):
		k.problem = path + " absent since it was last read: the last read stands"
	case err != nil:
		k.problem = fmt.Sprintf("%v: the last read stands", err)
	default:
		k.now, k.problem = s, ""
	}
	problem := k.problem
	k.mu.Unlock()
	if err != nil {
		if !hadProblem || before != nil {
			k.log.Warn().Err(err).Msg("kubelet config unreadable: " + problem)
		}
		return
	}
	if reflect.DeepEqual(before, s) {
		if hadProblem {
			k.log.Info().Msg("kubelet config readable again, as last read")
		}
		return
	}
	next := k.cfg.nextStart(s)
	var changes []string
	now, then := settingsByName(k.cfg.Policy()), settingsByName(next.Policy())
	for _, name := range kubeletTaken {
		if now[name].Value != then[name].Value {
			changes = append(changes, fmt.Sprintf("%s %s (now %s)", name, then[name].Value, now[name].Value))
		}
	}
	state := "the kubelet's image GC is handed over"
	if s.ImageGCOn() {
		state = "the kubelet's own image GC is on"
	}
	policy := "the agent's policy is as it would take it"
	if len(changes) > 0 {
		policy = "the agent's policy stays until its next start, which takes " + strings.Join(changes, ", ") +
			" (set them by flag, GCAGENT_* or the chart's config to keep today's)"
	}
	notes := s.Notes(k.cfg.ImageGCHighThreshold, k.capacity())
	e := k.log.Info()
	if len(notes) > 0 {
		e = k.log.Warn().Strs("notes", notes)
	}
	kubeletFields(e, s).Strs("next_start", changes).Msg("kubelet config changed: " + state + "; " + policy)
}

// settingsByName maps settings by name.
func settingsByName(list []Setting) map[string]Setting {
	m := make(map[string]Setting, len(list))
	for _, s := range list {
		m[s.Name] = s
	}
	return m
}

// kubeletFields adds what the kubelet's config says about image GC.
func kubeletFields(e *zerolog.Event, k *kubeletconfig.Settings) *zerolog.Event {
	return e.Int("kubelet_high_threshold", k.HighThreshold).Int("kubelet_low_threshold", k.LowThreshold).
		Float64("kubelet_minimum_gc_age_s", k.MinAge.Seconds()).Float64("kubelet_maximum_gc_age_s", k.MaxAge.Seconds()).
		Strs("set_in_file", k.Set).Bool("kubelet_image_gc", k.ImageGCOn())
}

// imageFSCapacity is the image filesystem's size in bytes, 0 when unknown.
func (a *agent) imageFSCapacity() uint64 {
	if a.imageFS != nil {
		if d, err := a.imageFS.Disk(); err == nil {
			return d.CapacityBytes
		}
	}
	return 0
}

// kubeletNotes are the warnings about the kubelet's config (as last read)
// against the policy in force and the image filesystem's capacity: nil
// without --kubelet-config.
func (a *agent) kubeletNotes() []string {
	if a.kubelet == nil {
		return nil
	}
	return a.kubelet.notes()
}

// reportKubelet says at start what the kubelet's config means for this
// agent (a line with what was taken and what was not, one warning per
// note: the kubelet's own image GC on, two collectors over one disk;
// eviction before GC), registers the gauge gcagent_kubelet_image_gc_enabled
// and sets up the follower that reads the file again when it changes.
func (a *agent) reportKubelet() {
	if a.cfg.KubeletConfig == "" {
		return
	}
	log := a.log.With().Str("component", "kubelet").Str("kubelet_config", a.cfg.KubeletConfig).Logger()
	if k := a.cfg.Kubelet; k != nil {
		var taken, notTaken []string
		for _, s := range a.cfg.Policy() {
			switch {
			case !slices.Contains(kubeletTaken, s.Name):
			case a.cfg.fromKubelet(s.Name):
				taken = append(taken, s.Name+"="+s.Value)
			default:
				notTaken = append(notTaken, fmt.Sprintf("%s=%s (%s)", s.Name, s.Value, s.Source))
			}
		}
		msg := "kubelet config read: its image GC settings are taken where no flag, variable or file line sets them"
		if k.HighThreshold == 100 {
			msg = "kubelet config read: its image GC is handed over (high threshold 100), so its thresholds are not taken; its ages are where nothing else sets them"
		}
		kubeletFields(log.Info(), k).Strs("taken", taken).Strs("not_taken", notTaken).Msg(msg)
	}
	a.kubelet = newKubeletFollower(a.cfg, a.imageFSCapacity, log)
	// The notes at start: an absent file is the preflight's line.
	if k, _ := a.kubelet.current(); k != nil {
		for _, n := range k.Notes(a.cfg.ImageGCHighThreshold, a.imageFSCapacity()) {
			log.Warn().Msg(n)
		}
	}
	a.reg.MustRegister(kubeletGauge{a.kubelet, prometheus.NewDesc("gcagent_kubelet_image_gc_enabled",
		"1 when the kubelet's config (--kubelet-config), as last read, leaves the kubelet's own image GC on (imageGCHighThresholdPercent below 100 or imageMaximumGCAge set): two collectors over one disk; 0 when handed over; no sample while the file was never read.",
		nil, nil)})
}

// kubeletGauge is gcagent_kubelet_image_gc_enabled, from the follower.
type kubeletGauge struct {
	k    *kubeletFollower
	desc *prometheus.Desc
}

func (g kubeletGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g kubeletGauge) Collect(ch chan<- prometheus.Metric) {
	s, _ := g.k.current()
	if s == nil {
		return
	}
	on := 0.0
	if s.ImageGCOn() {
		on = 1
	}
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, on)
}

// followKubelet reads the kubelet's config again whenever it changes, until
// ctx ends; without --kubelet-config it returns at once.
func (a *agent) followKubelet(ctx context.Context) error {
	if a.kubelet == nil {
		return nil
	}
	return a.kubelet.run(ctx)
}

// preflight logs `gcagent check`'s lines once at start; the kubelet's
// lines only when the kubelet's config was not read, as reportKubelet
// said what it read; never fail-closed, which would ask this agent
// itself what it keeps while it is still starting (its gauge and /readyz
// say it as it goes).
func (a *agent) preflight(ctx context.Context) {
	skip := []string{"fail-closed"}
	if a.cfg.Kubelet != nil {
		skip = append(skip, "kubelet-config", "kubelet-eviction")
	}
	LogChecks(ctx, a.cfg, a.log, skip...)
}
