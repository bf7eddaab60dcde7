package clock

import (
	"sync"
	"time"
)

// Fake is a Timers that tests step: nothing fires until Step moves the
// time past a timer's deadline. Every Reset and Stop is reported on Arms,
// so a test can wait, with a deadline, for the loop to arm what it
// expects. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	arms   chan Arm
}

// Arm is a timer of a Fake (its index, in the order the timers were made)
// armed at At, or stopped (At zero).
type Arm struct {
	Timer int
	At    time.Time
}

var _ Timers = (*Fake)(nil)

// NewFake returns a Fake at now.
func NewFake(now time.Time) *Fake {
	return &Fake{now: now, arms: make(chan Arm, 1<<16)}
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer firing once d after the fake now.
func (c *Fake) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	t := &fakeTimer{c: c, i: len(c.timers), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

// Step moves the clock by d and fires the timers that are due; it reports
// how many fired.
func (c *Fake) Step(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	fired := 0
	for _, t := range c.timers {
		if t.active && !c.now.Before(t.at) {
			t.active = false
			t.ch <- c.now
			fired++
		}
	}
	return fired
}

// Timers returns how many timers were ever made.
func (c *Fake) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Arms reports every Reset and Stop, in order.
func (c *Fake) Arms() <-chan Arm { return c.arms }

type fakeTimer struct {
	c      *Fake
	i      int
	ch     chan time.Time
	at     time.Time
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	t.drain()
	t.at, t.active = t.c.now.Add(d), true
	if d <= 0 {
		t.active = false
		t.ch <- t.c.now
	}
	a := Arm{t.i, t.at}
	t.c.mu.Unlock()
	t.c.arms <- a
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	t.drain()
	t.active = false
	t.c.mu.Unlock()
	t.c.arms <- Arm{t.i, time.Time{}}
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}
