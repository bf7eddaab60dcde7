package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deploy"
	"github.com/gcagent/gcagent/internal/testenv"
)

// BenchmarkChartReadinessAtKubeletStart: how long the chart's pod is not
// ready after the kubelet starts (a node's boot, a kubelet restart): the
// kubelet makes a probe worker created in the first period after its own
// start wait a random part of that period before its first probe, so this
// is bounded by the readiness probe's period (plus the startup probe's,
// 1 s, which readiness waits for). Each iteration restarts the real
// kubelet with the chart's default render running (containerd 1.6) and
// reads from its log when it was given the pod and when the pod was
// ready. Sub-benchmarks: the chart's readiness period, and 10 s (the
// chart's until 2026-11-27). Reported: the mean and the largest, in
// seconds.
func BenchmarkChartReadinessAtKubeletStart(b *testing.B) {
	m, err := deploy.DecodeManifest(deploy.ManifestYAML)
	if err != nil {
		b.Fatal(err)
	}
	img := testenv.AgentImage(b)
	chart := m.DaemonSet.Spec.Template.Spec.Containers[0].ReadinessProbe.PeriodSeconds
	for _, period := range []int32{chart, 10} {
		b.Run(fmt.Sprintf("readiness-period-%ds", period), func(b *testing.B) {
			c := testenv.StartContainerd(b, testenv.Options{Version: testenv.Versions()[0]})
			c.ImportArchive(b, img.Path)
			k := testenv.StartKubelet(b, c, testenv.KubeletOptions{NodeName: natsNode})
			cp := staticPodOf(b, m, hostPaths(b, c, k), img.Ref)
			cp.Pod.Spec.Containers[0].ReadinessProbe.PeriodSeconds = period
			cp.Edits = append(cp.Edits, fmt.Sprintf("readiness period %d s", period))
			cp.put(b, k)
			cp.podReady(b, k, 3*time.Minute)
			var delays []float64
			b.ResetTimer()
			for range b.N {
				off := logSize(b, k)
				k.Restart()
				pt := waitProbeTimes(b, k, off, cp, false)
				delays = append(delays, pt.ready.Sub(pt.added).Seconds())
			}
			b.StopTimer()
			sum := 0.0
			for _, d := range delays {
				sum += d
			}
			b.ReportMetric(sum/float64(len(delays)), "mean-s")
			b.ReportMetric(slices.Max(delays), "max-s")
			b.Logf("readiness period %d s: ready after the kubelet was given the pod: %.2f s", period, delays)
		})
	}
}
