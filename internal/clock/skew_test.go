package clock

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSkewAtTheStampsTime: a stamp gets the skew in effect when it was
// made, also after a restart on the same state dir, and a step made while
// no agent ran is placed when the offset file was written.
func TestSkewAtTheStampsTime(t *testing.T) {
	t.Setenv(TestOffsetEnv, "0s")
	dir := t.TempDir()
	history, offset := filepath.Join(dir, TestSkewHistoryFile), filepath.Join(dir, TestOffsetFile)
	s, err := SkewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Keep(history, offset); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	s.step(t0.Add(time.Minute), time.Hour)
	s.step(t0.Add(2*time.Minute), -time.Hour)
	// The agent stops; the host steps to +2h at t0+3m; an agent starts.
	if err := os.WriteFile(offset, []byte("2h"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(offset, t0.Add(3*time.Minute), t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	t.Setenv(TestOffsetEnv, "2h")
	again, err := SkewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Keep(history, offset); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   time.Duration
		want time.Duration
	}{{-time.Hour, 0}, {30 * time.Second, 0}, {90 * time.Second, time.Hour}, {150 * time.Second, -time.Hour}, {4 * time.Minute, 2 * time.Hour}} {
		if got := again.At(t0.Add(tc.at)); got != tc.want {
			t.Errorf("a stamp made at t0%+v: skew %s, want %s", tc.at, got, tc.want)
		}
	}
	if got := again.Get(); got != 2*time.Hour {
		t.Errorf("current skew %s, want 2h", got)
	}
	var none *Skew
	if none.At(t0) != 0 || none.Get() != 0 {
		t.Error("a nil Skew is not zero")
	}
}
