package gc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gcagent/gcagent/internal/promzero"
)

// imageMetrics are image GC's metrics: what the kubelet's image GC
// observability proposal (KEP-6053) asks of an image GC (passes by
// outcome, their duration, the bytes a pass set out to free against the
// bytes it freed, estimated and measured, what each pass kept and why,
// the filesystem's usage) and the agent's own (reaction, regrets).
type imageMetrics struct {
	passes   *prometheus.CounterVec
	removed  *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	skipped  *prometheus.CounterVec
	reaction prometheus.Histogram
	usage    prometheus.Gauge
	duration prometheus.Histogram
	target   *prometheus.CounterVec
	short    *prometheus.CounterVec
	kept     *prometheus.GaugeVec
}

// imageKeepReasons are the reasons a plan keeps an image (the kept gauge's
// labels).
var imageKeepReasons = []string{string(ReasonInUse), string(ReasonInUseByID), string(ReasonInUseBySnap), string(ReasonImageVolume),
	string(ReasonPinned), string(ReasonSandboxImage), string(ReasonKeepPattern), string(ReasonTooYoung), string(ReasonNotNeeded),
	string(ReasonKeepListUnread)}

func newImageMetrics(reg prometheus.Registerer, namespaces []string) (imageMetrics, error) {
	m := imageMetrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_passes_total", Help: "Image GC passes, by trigger and result (completed, failed).",
		}, []string{"trigger", "result"}),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_images_removed_total", Help: "Images removed, by containerd namespace and reason (space, max-age).",
		}, []string{"namespace", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_removed_bytes_total", Help: "Bytes of images removed, by containerd namespace, reason and measure (estimated: image sizes; measured: statfs).",
		}, []string{"namespace", "reason", "measure"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_images_skipped_total", Help: "Images a plan named but the executor did not remove, by reason.",
		}, []string{"reason"}),
		reaction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gcagent_image_gc_reaction_duration_seconds", Help: "Time from usage reaching the high threshold to the first image removed.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
		usage: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gcagent_image_gc_disk_usage_ratio", Help: "Image filesystem usage (0-1), in whole percent rounded up like the kubelet's.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gcagent_image_gc_pass_duration_seconds", Help: "How long image GC passes take, from the plan to the last delete measured.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		target: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_target_bytes_total", Help: "Bytes triggered image GC passes set out to free (the kubelet's amount to free), by trigger; compare with gcagent_image_gc_removed_bytes_total.",
		}, []string{"trigger"}),
		short: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_image_gc_shortfall_passes_total", Help: "Triggered image GC passes that ended above the low threshold, by trigger: what the kubelet reports as FreeDiskSpaceFailed.",
		}, []string{"trigger"}),
		kept: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gcagent_image_gc_images_kept", Help: "Images the last image GC pass's plan kept, by reason (in use, pinned, sandbox image, keep pattern, too young, not needed, keep list unread).",
		}, []string{"reason"}),
	}
	promzero.Labels(m.passes.WithLabelValues, imageTriggers, imagePassResults)
	promzero.Labels(m.removed.WithLabelValues, namespaces, imageRules)
	promzero.Labels(m.bytes.WithLabelValues, namespaces, imageRules, []string{"estimated", "measured"})
	promzero.Labels(m.skipped.WithLabelValues, imageSkipReasons)
	promzero.Labels(m.target.WithLabelValues, imageTriggers)
	promzero.Labels(m.short.WithLabelValues, imageTriggers)
	promzero.Labels(m.kept.WithLabelValues, imageKeepReasons)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.passes, m.removed, m.bytes, m.skipped, m.reaction, m.usage, m.duration, m.target, m.short, m.kept} {
			if err := reg.Register(c); err != nil {
				return m, fmt.Errorf("image gc metrics: %w", err)
			}
		}
	}
	return m, nil
}

// observePass counts a pass that ended with result.
func (m imageMetrics) observePass(trigger, result string, plan ImagePlan, pass ImagePass) {
	m.passes.WithLabelValues(trigger, result).Inc()
	m.duration.Observe(pass.End.Sub(pass.Start).Seconds())
	if plan.Triggered {
		m.target.WithLabelValues(trigger).Add(float64(max(plan.AmountToFree, 0)))
		if !pass.LowReached {
			m.short.WithLabelValues(trigger).Inc()
		}
	}
	counts := map[string]int{}
	for _, it := range plan.Keep {
		counts[string(it.Reason)]++
	}
	for _, r := range imageKeepReasons {
		m.kept.WithLabelValues(r).Set(float64(counts[r]))
	}
}
