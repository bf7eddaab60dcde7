// Package clock is the agent's one clock: the wall time read once at start,
// advanced by the monotonic clock, so that a step of the wall clock while
// the agent runs (NTP, an operator, a VM resume) moves no age and fires no
// timer early.
package clock

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Clock reads the time the agent plans with. The zero value is not usable;
// New returns one. Safe for concurrent use.
//
// Now is the wall time at start plus the monotonic time elapsed since, so it
// never jumps: after a wall-clock step it differs from the host's wall clock
// by that step until the agent restarts (a restart re-anchors it). Ages are
// differences of Now and times recorded from containerd's events, which the
// events package bounds by the agent's time of receipt, so they stay true
// across a step in either direction.
type Clock struct {
	start time.Time // carries the monotonic reading
	base  time.Time // wall reading at start (with the test offset), no monotonic reading
	skew  *Skew
}

// New returns a clock anchored at the current wall time as skew sees it
// (nil: the host's wall clock).
func New(skew *Skew) *Clock {
	start := time.Now()
	return &Clock{start: start, base: start.Add(skew.Get()).Round(0).UTC(), skew: skew}
}

// Now returns the agent's time (UTC, without a monotonic reading, so that it
// compares with recorded times by their wall values). A nil Clock reads the
// host's wall clock.
func (c *Clock) Now() time.Time {
	if c == nil {
		return time.Now().Round(0).UTC()
	}
	return c.base.Add(time.Since(c.start))
}

// Skew emulates a step of the host's wall clock for end-to-end tests: it is
// added to the wall clock the agent reads at start and to every time stamp
// it reads from containerd (containerd runs on the same host, so its stamps
// step with the host). A nil *Skew is zero. Safe for concurrent use.
type Skew struct{ ns atomic.Int64 }

// Get returns the current skew; zero for a nil Skew.
func (s *Skew) Get() time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(s.ns.Load())
}

// Set changes the skew: a wall-clock step of d - the previous value.
func (s *Skew) Set(d time.Duration) { s.ns.Store(int64(d)) }

// TestOffsetEnv names the hidden, test-only environment variable that
// enables a Skew: its value is the initial skew (a Go duration, e.g. "-1h").
// While it is set, the file TestOffsetFile in the state dir, when present,
// holds the current skew and is read again every TestOffsetPoll.
const (
	TestOffsetEnv  = "GCAGENT_TEST_CLOCK_OFFSET"
	TestOffsetFile = "test-clock-offset"
	TestOffsetPoll = 100 * time.Millisecond
)

// SkewFromEnv returns the Skew the test-only environment asks for, or nil
// (production: no skew) when TestOffsetEnv is unset. A value that does not
// parse is an error.
func SkewFromEnv() (*Skew, error) {
	v, ok := os.LookupEnv(TestOffsetEnv)
	if !ok {
		return nil, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TestOffsetEnv, err)
	}
	s := &Skew{}
	s.Set(d)
	return s, nil
}

// ReadFile sets the skew from path if it holds a valid duration; a missing
// or invalid file leaves it unchanged. It reports whether it changed.
func (s *Skew) ReadFile(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(b)))
	if err != nil || d == s.Get() {
		return false
	}
	s.Set(d)
	return true
}
