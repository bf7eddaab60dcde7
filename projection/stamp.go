package projection

import (
	"cmp"
	"math"
	"time"
)

// Stamp is an instant to the nanosecond in 8 bytes: a time.Time takes 24,
// and a busy node's projection holds six for each of tens of thousands of
// containers. The zero Stamp is the zero time.Time, before every other;
// 1970-01-01 is an instant like any other (images built reproducibly say
// so). Instants beyond what int64 nanoseconds since 1970 hold (years 1678
// to 2262) are kept as the nearest one it holds.
type Stamp struct {
	v uint64 // nanoseconds since 1970 with the sign bit flipped: 0 is the zero time, and order is v's
}

const stampSign = 1 << 63

var (
	stampMin = time.Unix(0, math.MinInt64+1) // MinInt64 itself is the zero Stamp
	stampMax = time.Unix(0, math.MaxInt64)
)

// StampOf returns t as a Stamp.
func StampOf(t time.Time) Stamp {
	switch {
	case t.IsZero():
		return Stamp{}
	case t.Before(stampMin):
		t = stampMin
	case t.After(stampMax):
		t = stampMax
	}
	return Stamp{uint64(t.UnixNano()) ^ stampSign}
}

// Time returns the instant in UTC; the zero Stamp gives the zero time.
func (s Stamp) Time() time.Time {
	if s.v == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s.v^stampSign)).UTC()
}

// IsZero reports whether s is the zero time.
func (s Stamp) IsZero() bool { return s.v == 0 }

// Before and After order instants; the zero Stamp is before all others.
func (s Stamp) Before(u Stamp) bool { return s.v < u.v }
func (s Stamp) After(u Stamp) bool  { return s.v > u.v }

// Compare returns -1, 0 or +1 as s is before, at or after u.
func (s Stamp) Compare(u Stamp) int { return cmp.Compare(s.v, u.v) }

func (s Stamp) String() string { return s.Time().String() }

// MarshalJSON and UnmarshalJSON write and read what a time.Time does, so
// JSON holds a container's times as before.
func (s Stamp) MarshalJSON() ([]byte, error) { return s.Time().MarshalJSON() }

func (s *Stamp) UnmarshalJSON(b []byte) error {
	var t time.Time
	if err := t.UnmarshalJSON(b); err != nil {
		return err
	}
	*s = StampOf(t)
	return nil
}
