package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/kubeletconfig"
	"github.com/prometheus/client_golang/prometheus"
)

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
// (twice it, at least 2m). An unreadable or invalid file (unknown field,
// wrong kind) is an error naming the flag and the file.
func (c *Config) AdoptKubelet() error {
	if c.KubeletConfig == "" {
		return nil
	}
	k, err := kubeletconfig.Read(c.KubeletConfig)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("%s: %v", c.KubeletConfig, pe.Err)
		}
		return fmt.Errorf("invalid --kubelet-config %v", err)
	}
	c.Kubelet = k
	if c.Sources == nil {
		c.Sources = map[string]string{}
	}
	src := "kubelet-config " + c.KubeletConfig
	adopt := func(name string, set func()) {
		if _, given := c.Sources[name]; !given {
			set()
			c.Sources[name] = src
		}
	}
	if k.HighThreshold < 100 {
		adopt("image-gc-high-threshold", func() { c.ImageGCHighThreshold = k.HighThreshold })
		adopt("image-gc-low-threshold", func() { c.ImageGCLowThreshold = k.LowThreshold })
	}
	adopt("minimum-image-ttl-duration", func() { c.MinimumImageTTL = k.MinAge })
	adopt("image-maximum-gc-age", func() { c.ImageMaximumGCAge = k.MaxAge })
	// Its pod status lags up to 1.5 syncFrequency (the pod workers'
	// jitter); twice that, never less than the default.
	adopt("kubelet-status-lag", func() { c.KubeletStatusLag = max(gc.DefaultKubeletStatusLag, 2*k.SyncFrequency) })
	return nil
}

// kubeletNotes are the warnings about the kubelet's config against the
// policy in force and the image filesystem's capacity (when measured):
// nil without --kubelet-config.
func (a *agent) kubeletNotes() []string {
	if a.cfg.Kubelet == nil {
		return nil
	}
	var capacity uint64
	if a.imageFS != nil {
		if d, err := a.imageFS.Disk(); err == nil {
			capacity = d.CapacityBytes
		}
	}
	return a.cfg.Kubelet.Notes(a.cfg.ImageGCHighThreshold, capacity)
}

// reportKubelet says at start what the kubelet's config means for this
// agent: a line with what was taken, one warning per note (the kubelet's
// own image GC on: two collectors over one disk; eviction before GC), and
// the gauge gcagent_kubelet_image_gc_enabled.
func (a *agent) reportKubelet() {
	k := a.cfg.Kubelet
	if k == nil {
		return
	}
	log := a.log.With().Str("component", "kubelet").Str("kubelet_config", k.Path).Logger()
	e := log.Info().Int("kubelet_high_threshold", k.HighThreshold).Int("kubelet_low_threshold", k.LowThreshold).
		Float64("kubelet_minimum_gc_age_s", k.MinAge.Seconds()).Float64("kubelet_maximum_gc_age_s", k.MaxAge.Seconds()).
		Strs("set_in_file", k.Set).Bool("kubelet_image_gc", k.ImageGCOn())
	if k.HighThreshold == 100 {
		e.Msg("kubelet config read: its image GC is handed over (high threshold 100), so its thresholds are not taken; its ages are defaults here")
	} else {
		e.Msg("kubelet config read: its image GC thresholds and ages are defaults here")
	}
	for _, n := range a.kubeletNotes() {
		log.Warn().Msg(n)
	}
	on := 0.0
	if k.ImageGCOn() {
		on = 1
	}
	a.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gcagent_kubelet_image_gc_enabled",
		Help: "1 when the kubelet's config (--kubelet-config) leaves the kubelet's own image GC on (imageGCHighThresholdPercent below 100 or imageMaximumGCAge set): two collectors over one disk; 0 when handed over.",
	}, func() float64 { return on }))
}

// preflight logs `gcagent check`'s lines once at start; the kubelet's
// lines only without --kubelet-config, which reportKubelet already said.
func (a *agent) preflight(ctx context.Context) {
	var skip []string
	if a.cfg.Kubelet != nil {
		skip = []string{"kubelet-config", "kubelet-eviction"}
	}
	LogChecks(ctx, a.cfg, a.log, skip...)
}
