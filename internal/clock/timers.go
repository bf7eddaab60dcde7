package clock

import "time"

// Timers is the time a loop reads and the timers it arms: every GC loop
// and the log cleaner take one, so their tests step a Fake instead of
// sleeping.
type Timers interface {
	Now() time.Time
	// NewTimer returns a timer firing once after d.
	NewTimer(d time.Duration) Timer
}

// Timer has time.Timer's semantics (Go 1.23+: after Stop or Reset no stale
// value is received).
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// System returns Go's timers (monotonic: a wall-clock step does not move
// them) with now as the time; nil now is time.Now.
func System(now func() time.Time) Timers {
	return system{now: now}
}

type system struct{ now func() time.Time }

func (c system) Now() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

func (system) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (r systemTimer) C() <-chan time.Time   { return r.t.C }
func (r systemTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r systemTimer) Stop()                 { r.t.Stop() }
