package gc

import "testing"

func TestLowFollowing(t *testing.T) {
	for _, tc := range []struct{ wasHigh, low, high, want int }{
		{85, 80, 70, 65}, // the README's what-if: the default low moves down, 5 below
		{85, 80, 90, 80}, // a low that fits stays: the meaning of the flags as run takes them
		{85, 80, 80, 80}, // equal fits
		{90, 60, 50, 20}, // the gap of the pair it came with
		{85, 80, 3, 0},   // never below 0
		{70, 80, 60, 60}, // an inverted pair (no gap) follows to the high one
	} {
		if got := LowFollowing(tc.wasHigh, tc.low, tc.high); got != tc.want {
			t.Errorf("LowFollowing(%d, %d, %d) = %d, want %d", tc.wasHigh, tc.low, tc.high, got, tc.want)
		}
	}
}
