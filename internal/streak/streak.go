// Package streak collapses a run of identical failures into a few log
// lines: the first at once, then one per backoff step carrying the count,
// and one when the run ends.
package streak

import (
	"sync"
	"time"
)

// Defaults of a zero Streak's steps between log lines.
const (
	DefaultFirstStep = time.Second
	DefaultMaxStep   = 5 * time.Minute
)

// Streak is a run of failures. The zero value logs the first failure at
// once, then after 1 s, 2 s, 4 s, ... up to 5 min between lines. Safe for
// concurrent use.
type Streak struct {
	// FirstStep and MaxStep bound the wait between two lines of one run;
	// zero takes the defaults.
	FirstStep, MaxStep time.Duration

	mu    sync.Mutex
	n     int       // failures in the run
	since time.Time // first failure of the run
	msg   string    // the last failure's text
	next  time.Time // no line before this, unless the text changes
	step  time.Duration
}

// Fail records a failure with text msg at now. It reports whether to log
// it and how many failures the run holds so far: true for the first, for
// one whose text differs from the last, and once the current step has
// passed since the last line (the step then doubles).
func (s *Streak) Fail(now time.Time, msg string) (log bool, failures int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, maxStep := s.FirstStep, s.MaxStep
	if first <= 0 {
		first = DefaultFirstStep
	}
	if maxStep < first {
		maxStep = max(DefaultMaxStep, first)
	}
	s.n++
	if s.n == 1 {
		s.since = now
	}
	switch {
	case s.n == 1 || msg != s.msg:
		s.step = first
	case now.Before(s.next):
		return false, s.n
	default:
		s.step = min(s.step*2, maxStep)
	}
	s.msg, s.next = msg, now.Add(s.step)
	return true, s.n
}

// Recover ends the run: it returns how many failures it held (0 when
// there was none, then nothing needs saying) and when it began.
func (s *Streak) Recover() (failures int, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	failures, since = s.n, s.since
	s.n, s.msg, s.since, s.next, s.step = 0, "", time.Time{}, time.Time{}, 0
	return failures, since
}

// Failures is how many failures the current run holds.
func (s *Streak) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
