package testenv

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestProcReadersReadThisProcess(t *testing.T) {
	m, err := ReadProcMemory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.Peak < m.RSS {
		t.Fatalf("memory %+v: want 0 < RSS <= Peak", m)
	}
	before, err := ReadProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the counter (10ms ticks) moves; a loaded machine may
	// deschedule the test, so only a bound on wall time.
	start := time.Now()
	for {
		after, err := ReadProcCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			if d := after - before; d > time.Since(start)*time.Duration(runtime.NumCPU())+20*time.Millisecond {
				t.Fatalf("%s of CPU counted in %s", d, time.Since(start))
			}
			return
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("CPU time stayed at %s over 5s of spinning", before)
		}
	}
}

func TestParallelRunsEachIndexOnceAndStopsAtAnError(t *testing.T) {
	var seen [100]atomic.Int32
	if err := Parallel(context.Background(), len(seen), 7, func(_ context.Context, i int) error {
		seen[i].Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range seen {
		if n := seen[i].Load(); n != 1 {
			t.Fatalf("index %d ran %d times", i, n)
		}
	}
	boom := errors.New("boom")
	var ran atomic.Int32
	err := Parallel(context.Background(), 1000, 4, func(_ context.Context, i int) error {
		ran.Add(1)
		if i == 10 {
			return boom
		}
		time.Sleep(time.Millisecond) // each index takes a moment: the error at 10 comes before all ran
		return nil
	})
	if !errors.Is(err, boom) || ran.Load() == 1000 {
		t.Fatalf("err %v after %d runs: want boom, and the rest skipped", err, ran.Load())
	}
}
