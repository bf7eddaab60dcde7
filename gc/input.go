package gc

import (
	"fmt"
	"time"
)

// InputState is what the agent knows of one input a delete decision reads
// (a listing, the fleet keep list, a directory, the clock, the disk): the
// design's invariant 7. The zero value is InputUnknown, so an input nobody
// has set protects whatever it could protect: no default value ever stands
// in for an input not yet read.
type InputState uint8

// Input states.
const (
	// InputUnknown: never read (not yet, or every read failed).
	InputUnknown InputState = iota
	// InputKnown: read, and current.
	InputKnown
	// InputStale: read once, but not lately (its source stopped answering
	// or its watch failed); its last value is all there is.
	InputStale
)

// String is the state's name as plans, logs and metrics show it.
func (s InputState) String() string {
	switch s {
	case InputUnknown:
		return "unknown"
	case InputKnown:
		return "known"
	case InputStale:
		return "stale"
	}
	return fmt.Sprintf("InputState(%d)", uint8(s))
}

// MarshalText makes an InputState its name in JSON.
func (s InputState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads an InputState's name (a plan or status read back).
func (s *InputState) UnmarshalText(b []byte) error {
	for _, v := range []InputState{InputUnknown, InputKnown, InputStale} {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("input state %q: want unknown, known or stale", b)
}

// Input is one input with its state: Since is when it was last read
// (known, stale) or when the agent began to wait for it (unknown), on the
// agent's clock; Cause says, for unknown and stale, why (the error of the
// last read, "not read yet").
type Input struct {
	State InputState `json:"state"`
	Since time.Time  `json:"since,omitzero"`
	Cause string     `json:"cause,omitempty"`
}

// Known reports whether the input is read and current.
func (in Input) Known() bool { return in.State == InputKnown }

// KnownInput is an input read at t.
func KnownInput(t time.Time) Input { return Input{State: InputKnown, Since: t} }
