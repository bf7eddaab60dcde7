// Package wait is how tests wait for an observable result: poll a
// condition until it holds or a deadline passes, never assuming how fast
// the machine is. Loops with timers are driven by clock.Fake instead.
package wait

import (
	"testing"
	"time"
)

// Poll is how often a condition is asked again.
const Poll = 5 * time.Millisecond

// For asks cond every Poll until it returns "" and fails t with cond's last
// explanation once within has passed.
func For(t testing.TB, within time.Duration, cond func() string) {
	t.Helper()
	Every(t, within, Poll, cond)
}

// Every is For asking every interval: a benchmark that measures the agent
// asks it no more often than it must.
func Every(t testing.TB, within, every time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not after %s: %s", within, why)
		}
		time.Sleep(every)
	}
}

// Until is For for a condition that holds or not; what names it in the
// failure.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	For(t, within, func() string {
		if cond() {
			return ""
		}
		return what
	})
}
