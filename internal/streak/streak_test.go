package streak

import (
	"testing"
	"time"
)

func TestStreakLogsAtBackoff(t *testing.T) {
	var s Streak
	t0 := time.Unix(1000, 0)
	var logged []int // seconds since t0 of the failures logged
	// A failure every 250 ms for 10 s: 40 failures.
	for i := range 40 {
		now := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		if ok, n := s.Fail(now, "dial: no such socket"); ok {
			logged = append(logged, n)
		}
	}
	// Lines at failure 1 (0 s), 5 (1 s), 13 (3 s), 29 (7 s).
	want := []int{1, 5, 13, 29}
	if len(logged) != len(want) {
		t.Fatalf("logged at failures %v, want %v", logged, want)
	}
	for i := range want {
		if logged[i] != want[i] {
			t.Fatalf("logged at failures %v, want %v", logged, want)
		}
	}
	// A different text is logged at once.
	if ok, n := s.Fail(t0.Add(10*time.Second), "connection refused"); !ok || n != 41 {
		t.Errorf("changed text: log %v failures %d, want true 41", ok, n)
	}
	n, since := s.Recover()
	if n != 41 || !since.Equal(t0) {
		t.Errorf("Recover = %d, %s; want 41, %s", n, since, t0)
	}
	if n, _ := s.Recover(); n != 0 {
		t.Errorf("second Recover = %d, want 0", n)
	}
	if ok, n := s.Fail(t0.Add(11*time.Second), "dial: no such socket"); !ok || n != 1 {
		t.Errorf("after recovery: log %v failures %d, want true 1", ok, n)
	}
}

func TestStreakStepCapped(t *testing.T) {
	s := Streak{FirstStep: time.Second, MaxStep: 4 * time.Second}
	t0 := time.Unix(0, 0)
	var at []time.Duration
	for i := range 30 * 10 { // every 100 ms for 30 s
		d := time.Duration(i) * 100 * time.Millisecond
		if ok, _ := s.Fail(t0.Add(d), "x"); ok {
			at = append(at, d)
		}
	}
	// 0, 1, 3, 7, then every 4 s: 11, 15, 19, 23, 27.
	if len(at) != 9 || at[4]-at[3] != 4*time.Second || at[8] != 27*time.Second {
		t.Errorf("logged at %v", at)
	}
}
