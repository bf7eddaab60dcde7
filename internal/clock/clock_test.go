package clock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNowFollowsMonotonicNotSkew: a step of the (emulated) wall clock after
// start does not move Now; the skew at start anchors it.
func TestNowFollowsMonotonicNotSkew(t *testing.T) {
	skew := &Skew{}
	skew.Set(-time.Hour)
	before := time.Now()
	c := New(skew)
	now := c.Now()
	if d := before.Add(-time.Hour).Sub(now); d > 0 || d < -time.Second {
		t.Fatalf("Now at start = %v, want the wall clock shifted by the start skew (%v)", now, before.Add(-time.Hour))
	}
	if now.Location() != time.UTC {
		t.Fatalf("Now is in %v, want UTC", now.Location())
	}
	for _, step := range []time.Duration{time.Hour, -2 * time.Hour} {
		skew.Set(step)
		later := c.Now()
		if d := later.Sub(now); d < 0 || d > time.Second {
			t.Fatalf("after a step to %v, Now moved by %v, want only the elapsed time", step, d)
		}
		now = later
	}
	// Now carries no monotonic reading: it compares with recorded times by
	// wall value (String shows "m=" when a monotonic reading is present).
	if s := now.String(); strings.Contains(s, " m=") {
		t.Fatalf("Now carries a monotonic reading: %s", s)
	}
}

func TestNilClockAndSkew(t *testing.T) {
	var c *Clock
	if d := time.Since(c.Now()); d < 0 || d > time.Second {
		t.Fatalf("nil Clock Now is %v off the wall clock", d)
	}
	var s *Skew
	if s.Get() != 0 {
		t.Fatal("nil Skew is not zero")
	}
}

func TestSkewFromEnvAndFile(t *testing.T) {
	t.Setenv(TestOffsetEnv, "")
	os.Unsetenv(TestOffsetEnv)
	if s, err := SkewFromEnv(); s != nil || err != nil {
		t.Fatalf("unset: %v, %v; want nil, nil (production)", s, err)
	}
	t.Setenv(TestOffsetEnv, "-1h")
	s, err := SkewFromEnv()
	if err != nil || s.Get() != -time.Hour {
		t.Fatalf("-1h: %v, %v", s.Get(), err)
	}
	t.Setenv(TestOffsetEnv, "an hour")
	if _, err := SkewFromEnv(); err == nil {
		t.Fatal("an invalid offset was accepted")
	}
	path := filepath.Join(t.TempDir(), TestOffsetFile)
	if s.ReadFile(path) || s.Get() != -time.Hour {
		t.Fatal("a missing file changed the skew")
	}
	for _, tc := range []struct {
		content string
		changed bool
		want    time.Duration
	}{
		{"1h\n", true, time.Hour},
		{"1h", false, time.Hour},
		{"garbage", false, time.Hour},
		{" -30m ", true, -30 * time.Minute},
	} {
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := s.ReadFile(path); got != tc.changed || s.Get() != tc.want {
			t.Fatalf("file %q: changed %v, skew %v; want %v, %v", tc.content, got, s.Get(), tc.changed, tc.want)
		}
	}
}
