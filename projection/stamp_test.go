package projection

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// TestStampKeepsInstants: a Stamp gives back the instant it was made of,
// to the nanosecond and in UTC, the zero time and 1970 included, and tells
// them apart; beyond int64 nanoseconds it keeps the nearest instant.
func TestStampKeepsInstants(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		ny = time.FixedZone("EST", -5*3600)
	}
	for _, tc := range []time.Time{
		{},
		time.Unix(0, 0),
		time.Unix(0, 1),
		time.Unix(0, -1),
		time.Unix(-5, 0),
		time.Date(2026, 11, 25, 13, 53, 17, 123456789, time.UTC),
		time.Date(2026, 11, 25, 8, 53, 17, 1, ny),
		time.Unix(0, math.MaxInt64),
		time.Unix(0, math.MinInt64+1),
	} {
		s := StampOf(tc)
		if got := s.Time(); !got.Equal(tc) || got.Location() != time.UTC && !got.IsZero() {
			t.Errorf("StampOf(%v).Time() = %v, want the same instant in UTC", tc, got)
		}
		if s.IsZero() != tc.IsZero() {
			t.Errorf("StampOf(%v).IsZero() = %v", tc, s.IsZero())
		}
	}
	for _, c := range []struct{ in, want time.Time }{
		{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MinInt64+1)},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MaxInt64)},
	} {
		if got := StampOf(c.in).Time(); !got.Equal(c.want) {
			t.Errorf("StampOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestStampOrdersAsTime: Before, After and Compare agree with time.Time's,
// with the zero time first.
func TestStampOrdersAsTime(t *testing.T) {
	ts := []time.Time{{}, time.Unix(-5, 0), time.Unix(0, -1), time.Unix(0, 0), time.Unix(0, 1), time.Unix(1e9, 7), time.Unix(0, math.MaxInt64)}
	for _, a := range ts {
		for _, b := range ts {
			sa, sb := StampOf(a), StampOf(b)
			if sa.Before(sb) != a.Before(b) || sa.After(sb) != a.After(b) || sa.Compare(sb) != a.Compare(b) || (sa == sb) != a.Equal(b) {
				t.Errorf("%v vs %v: Before %v After %v Compare %d, time says %v %v %d", a, b, sa.Before(sb), sa.After(sb), sa.Compare(sb), a.Before(b), a.After(b), a.Compare(b))
			}
		}
	}
}

// TestStampJSONAsTime: JSON holds a Stamp as it held the time.Time, and
// omitzero leaves the zero one out.
func TestStampJSONAsTime(t *testing.T) {
	type rec struct {
		A Stamp `json:"a"`
		B Stamp `json:"b,omitzero"`
		C Stamp `json:"c,omitzero"`
	}
	at := time.Date(2026, 11, 25, 13, 53, 17, 5, time.UTC)
	b, err := json.Marshal(rec{A: StampOf(at), C: StampOf(time.Unix(0, 0))})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":"2026-11-25T13:53:17.000000005Z","c":"1970-01-01T00:00:00Z"}`; string(b) != want {
		t.Fatalf("JSON %s, want %s", b, want)
	}
	var back rec
	if err := json.Unmarshal(b, &back); err != nil || back.A != StampOf(at) || !back.B.IsZero() || back.C != StampOf(time.Unix(0, 0)) {
		t.Fatalf("read back %+v (%v)", back, err)
	}
	if err := json.Unmarshal([]byte(`{"a":"yesterday"}`), &back); err == nil {
		t.Fatal("a malformed time was read")
	}
}
