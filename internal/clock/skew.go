package clock

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Skew emulates steps of the host's wall clock for end-to-end tests: the
// current skew is added to the wall clock the agent reads at start, and to
// every time stamp it reads from containerd the skew in effect when the
// stamp was made (At): containerd runs on the same host, so its stamps step
// with the host from the step on, and the ones made before stay as they
// were. A nil *Skew is zero. Safe for concurrent use.
type Skew struct {
	mu      sync.Mutex
	steps   []SkewStep // oldest first; the last one's is the current skew
	history string     // the file the steps are saved in (Keep); "" none
}

// SkewStep is one emulated step: from host time At on, the skew is Skew.
type SkewStep struct {
	At   time.Time     `json:"at"`
	Skew time.Duration `json:"skew"`
}

// Get returns the current skew; zero for a nil Skew.
func (s *Skew) Get() time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.steps) == 0 {
		return 0
	}
	return s.steps[len(s.steps)-1].Skew
}

// At returns the skew in effect at host time t: that of the last step at
// or before t, or, before every step, the first one's (the skew the
// emulated host had before anything stepped it). Zero for a nil Skew.
func (s *Skew) At(t time.Time) time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.steps) == 0 {
		return 0
	}
	i, _ := slices.BinarySearchFunc(s.steps, t, func(st SkewStep, t time.Time) int {
		if st.At.After(t) {
			return 1
		}
		return -1
	})
	return s.steps[max(i-1, 0)].Skew
}

// Set steps the skew to d now: a wall-clock step of d - the previous value.
func (s *Skew) Set(d time.Duration) { s.step(time.Now(), d) }

func (s *Skew) step(at time.Time, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.steps); n > 0 && s.steps[n-1].Skew == d {
		return
	}
	if n := len(s.steps); n > 0 && at.Before(s.steps[n-1].At) {
		at = s.steps[n-1].At
	}
	s.steps = append(s.steps, SkewStep{At: at.Round(0), Skew: d})
	s.save()
}

// save writes the steps to the history file, if any; a test's agent that
// cannot is one whose emulation would go wrong after a restart, so it
// panics rather than go on.
func (s *Skew) save() {
	if s.history == "" {
		return
	}
	b, err := json.Marshal(s.steps)
	if err == nil {
		err = os.WriteFile(s.history, b, 0o600)
	}
	if err != nil {
		panic(fmt.Sprintf("test clock skew history %s: %v", s.history, err))
	}
}

// TestOffsetEnv names the hidden, test-only environment variable that
// enables a Skew: its value is the initial skew (a Go duration, e.g. "-1h").
// While it is set, the file TestOffsetFile in the state dir, when present,
// holds the current skew and is read again every TestOffsetPoll (so a file
// left by an earlier run wins over the variable after the first poll: a
// test restarting the agent sets both to the same value). The steps are
// kept in TestSkewHistoryFile, so that an agent restarted on the state dir
// knows the skew each earlier stamp was made with.
const (
	TestOffsetEnv       = "GCAGENT_TEST_CLOCK_OFFSET"
	TestOffsetFile      = "test-clock-offset"
	TestSkewHistoryFile = "test-clock-offset.history"
	TestOffsetPoll      = 100 * time.Millisecond
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
	return &Skew{steps: []SkewStep{{Skew: d}}}, nil
}

// Keep continues the steps an earlier run saved in history (a state dir's
// TestSkewHistoryFile) and saves every step there from now on. A current
// skew other than the last one saved is a step while no agent ran: it is
// placed at the time offsetFile (TestOffsetFile) was last written when it
// holds that skew, else now.
func (s *Skew) Keep(history, offsetFile string) error {
	b, err := os.ReadFile(history)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var saved []SkewStep
	if err == nil {
		if err := json.Unmarshal(b, &saved); err != nil {
			return fmt.Errorf("%s: %w", history, err)
		}
	}
	cur := s.Get()
	at := time.Now()
	if fi, err := os.Stat(offsetFile); err == nil {
		if d, ok := readSkew(offsetFile); ok && d == cur {
			at = fi.ModTime()
		}
	}
	s.mu.Lock()
	s.history = history
	if len(saved) > 0 {
		s.steps = saved
	}
	s.mu.Unlock()
	if len(saved) > 0 {
		s.step(at, cur)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.save()
	return nil
}

// ReadFile steps the skew to the value path holds, at the time path was
// written, if it is a valid duration other than the current skew; a
// missing or invalid file leaves it unchanged. It reports whether it
// stepped.
func (s *Skew) ReadFile(path string) bool {
	d, ok := readSkew(path)
	if !ok || d == s.Get() {
		return false
	}
	at := time.Now()
	if fi, err := os.Stat(path); err == nil && fi.ModTime().Before(at) {
		at = fi.ModTime()
	}
	s.step(at, d)
	return true
}

func readSkew(path string) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(b)))
	return d, err == nil
}
