package gc

// LowFollowing is the low threshold that goes with a high threshold moved
// to high by a what-if that did not give the low one (plan, replay and
// each row of replay --sweep): low, the one of the pair wasHigh/low, stays
// while it does not exceed high; above it, it moves down with it, keeping
// the gap the pair had (85/80 moved to 70: 65), never below 0.
func LowFollowing(wasHigh, low, high int) int {
	if low <= high {
		return low
	}
	return max(high-max(wasHigh-low, 0), 0)
}
