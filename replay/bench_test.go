package replay

import (
	"syscall"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/tracegen"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReplay replays a generated busy node's month
// (tracegen.DefaultParams: 10,000 images, about 390,000 records) with
// the recorded policy, in each order. One op is one replay of the month;
// cpu-s/op is the process's CPU time, which a loaded machine does not
// inflate as it does the wall time.
func BenchmarkReplay(b *testing.B) {
	recs := tracegen.Generate(tracegen.DefaultParams())
	for _, order := range []string{OrderLRU, OrderGDSF, OrderGDSFBytes} {
		b.Run(order, func(b *testing.B) {
			cpu := cpuTime()
			var res Result
			for b.Loop() {
				res = Simulate(recs, Options{Order: order})
			}
			b.ReportMetric((cpuTime()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(len(recs)), "records")
			b.ReportMetric(float64(res.Replayed.Deletions), "deletions")
		})
	}
}
