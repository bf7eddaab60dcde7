package clock

import (
	"encoding/json"
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

// TestContinue: within one boot, a restarted agent's time goes on from the
// saved mark plus the uptime since, whatever the wall clock did meanwhile;
// without a usable mark it is the wall clock.
func TestContinue(t *testing.T) {
	if bootID() == "" {
		t.Skip("no /proc/sys/kernel/random/boot_id")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, File)
	up := uptime()
	write := func(t *testing.T, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	markJSON := func(boot string, upAt time.Duration, at time.Time) string {
		b, err := json.Marshal(mark{BootID: boot, Uptime: upAt, Time: at})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	wallNow := time.Now().UTC()
	for _, tc := range []struct {
		name     string
		content  string // "" for no file
		wantStep time.Duration
	}{
		{"no mark", "", 0},
		{"garbage", "{", 0},
		{"mark of this boot, no step", markJSON(bootID(), up-10*time.Second, wallNow.Add(-10*time.Second)), 0},
		{"stepped +1h while down", markJSON(bootID(), up-10*time.Second, wallNow.Add(-10*time.Second-time.Hour)), time.Hour},
		{"stepped -1h while down", markJSON(bootID(), up-10*time.Second, wallNow.Add(-10*time.Second+time.Hour)), -time.Hour},
		{"mark of another boot", markJSON("another-boot", up-10*time.Second, wallNow.Add(-time.Hour)), 0},
		{"uptime from the future (another boot)", markJSON(bootID(), up+time.Hour, wallNow.Add(-time.Hour)), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(path)
			if tc.content != "" {
				write(t, tc.content)
			}
			c, step := Continue(nil, path)
			if d := step - tc.wantStep; d > time.Second || d < -time.Second {
				t.Fatalf("step %v, want %v", step, tc.wantStep)
			}
			want := time.Now().Add(-tc.wantStep)
			if d := c.Now().Sub(want); d > time.Second || d < -time.Second {
				t.Fatalf("Now %v, want about %v (the wall clock minus the step)", c.Now(), want)
			}
		})
	}

	// Save, then Continue under a wall clock stepped by +1h: the time goes on.
	skew := &Skew{}
	c := New(skew)
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	before := c.Now()
	skew.Set(time.Hour)
	c2, step := Continue(skew, path)
	if d := step - time.Hour; d > time.Second || d < -time.Second {
		t.Fatalf("after Save and a +1h step: step %v, want 1h", step)
	}
	if d := c2.Now().Sub(before); d < 0 || d > time.Second {
		t.Fatalf("the continued clock moved by %v, want only the elapsed time", d)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mark file: %v %v", st, err)
	}
}
