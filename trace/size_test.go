package trace_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gcagent/gcagent/internal/tracegen"
	"github.com/gcagent/gcagent/trace"
	bolt "go.etcd.io/bbolt"
)

// BenchmarkTraceSize stores a generated busy node's month (10,000
// images, tracegen.DefaultParams) as the agent does: the projection's
// records in chunks of a thousand, each disk measurement and policy in a
// transaction of its own, a compaction every 4,096 records (the
// projection's snapshots), bounded by the defaults. It reports the
// trace's bytes in the state file and the file's size.
func BenchmarkTraceSize(b *testing.B) {
	recs := tracegen.Generate(tracegen.DefaultParams())
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "state.db")
		db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		l, err := trace.Open(db, trace.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var batch []trace.Record
		flush := func() {
			if err := l.Put(batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
		for i, r := range recs {
			switch r.Ev {
			case trace.KindDisk, trace.KindPolicy:
				if err := l.Put(r); err != nil {
					b.Fatal(err)
				}
			default:
				if batch = append(batch, r); len(batch) == 1024 {
					flush()
				}
			}
			if i%4096 == 4095 || l.CompactDue() {
				if err := l.Compact(r.T); err != nil {
					b.Fatal(err)
				}
			}
		}
		flush()
		if err := l.Compact(recs[len(recs)-1].T); err != nil {
			b.Fatal(err)
		}
		n, chunks, err := trace.Size(db)
		if err != nil {
			b.Fatal(err)
		}
		db.Close()
		fi, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n)/(1<<20), "trace-MiB")
		b.ReportMetric(float64(fi.Size())/(1<<20), "file-MiB")
		b.ReportMetric(float64(len(recs)), "records")
		b.ReportMetric(float64(chunks), "chunks")
	}
}
