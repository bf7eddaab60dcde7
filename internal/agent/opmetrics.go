package agent

import (
	"runtime"
	"sync"
	"time"

	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/projection"
	"github.com/prometheus/client_golang/prometheus"
)

// opsCollector exports, at scrape time, what the alerting rules and the
// dashboard of deploy/ need beyond the components' own metrics: the build,
// the thresholds the disk is compared with, the image filesystem as image GC
// last sampled it (no extra statfs per scrape), what GC could still free,
// and whether containerd is connected.
type opsCollector struct {
	a                                        *agent
	build, high, low, capacity, available    *prometheus.Desc
	reclaimable, connected, ready, sampledAt *prometheus.Desc
	unsettled                                *prometheus.Desc

	// The reclaimable bytes take a plan of every image: computed at most
	// every reclaimableEvery, however often the agent is scraped.
	mu            sync.Mutex
	reclaimableAt time.Time
	reclaimableN  int64
}

// reclaimableEvery bounds how often a scrape plans every image.
const reclaimableEvery = 5 * time.Second

func newOpsCollector(a *agent) *opsCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &opsCollector{
		a:           a,
		build:       d("gcagent_build_info", "Always 1; the labels name the running build.", "version", "commit", "goversion"),
		high:        d("gcagent_image_gc_high_threshold_ratio", "Disk usage (0-1) at which image GC starts (--image-gc-high-threshold/100; 1 disables it)."),
		low:         d("gcagent_image_gc_low_threshold_ratio", "Disk usage (0-1) image GC frees down to (--image-gc-low-threshold/100)."),
		capacity:    d("gcagent_image_fs_capacity_bytes", "Capacity of the image filesystem at image GC's last sample."),
		available:   d("gcagent_image_fs_available_bytes", "Bytes available to unprivileged users on the image filesystem at image GC's last sample."),
		sampledAt:   d("gcagent_image_fs_sample_timestamp_seconds", "When image GC last sampled the image filesystem (0: never)."),
		reclaimable: d("gcagent_image_gc_reclaimable_bytes", "Sizes of the images no rule protects now: what image GC could free at most."),
		connected:   d("gcagent_containerd_connected", "1 while the agent is subscribed to containerd's events, else 0."),
		ready:       d("gcagent_ready", "1 when /readyz is 200 (containerd connected and projection synced), else 0."),
		unsettled:   d("gcagent_deletes_unsettled", "Deletes whose outcome containerd has not told yet: while above 0, nothing else is deleted."),
	}
}

// Describe implements prometheus.Collector.
func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.build, c.high, c.low, c.capacity, c.available, c.sampledAt, c.reclaimable, c.connected, c.ready, c.unsettled} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; it is safe for concurrent use.
func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.build, 1, version.Version, version.Commit, runtime.Version())
	gauge(c.high, float64(a.cfg.ImageGCHighThreshold)/100)
	gauge(c.low, float64(a.cfg.ImageGCLowThreshold)/100)
	if a.imageGC != nil {
		st := a.imageGC.Status()
		gauge(c.capacity, float64(st.Disk.CapacityBytes))
		gauge(c.available, float64(st.Disk.AvailableBytes))
		ts := 0.0
		if !st.SampledAt.IsZero() {
			ts = float64(st.SampledAt.UnixNano()) / 1e9
		}
		gauge(c.sampledAt, ts)
	}
	c.mu.Lock()
	if now := time.Now(); c.reclaimableAt.IsZero() || now.Sub(c.reclaimableAt) >= reclaimableEvery {
		a.live.ViewAll(func(states []*projection.State) { c.reclaimableN = a.reclaimableBytes(states, now.UTC()) })
		c.reclaimableAt = now
	}
	gauge(c.reclaimable, float64(c.reclaimableN))
	c.mu.Unlock()
	if a.deletes != nil {
		gauge(c.unsettled, float64(a.deletes.Unsettled()))
	}
	connected := a.source.Connected()
	gauge(c.connected, b2f(connected))
	gauge(c.ready, b2f(connected && a.live.Synced()))
}

// metricNamespaces are the managed namespaces known at start, whose
// metric series exist at zero from the start: the listed ones, none under
// --namespace=* (a namespace's series appear as it is first seen).
func (c Config) metricNamespaces() []string {
	nss, err := c.Namespaces()
	if err != nil || nss.All {
		return nil
	}
	return nss.Names
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
