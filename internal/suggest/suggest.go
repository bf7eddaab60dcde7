// Package suggest names the known word a mistyped one was most likely
// meant to be: the hint of an unknown flag, variable, key or command.
package suggest

import "strings"

// DidYouMean is " (did you mean X?)" with the candidate nearest to typed
// when it is near enough to be a typo, else with those typed starts (up to
// three); "" when none fits.
func DidYouMean(typed string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(typed), strings.ToLower(c)); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	var fits []string
	if best != "" && bestD <= max(2, len(typed)/4) {
		fits = append(fits, best)
	} else if len(strings.TrimLeft(typed, "-")) >= 3 {
		for _, c := range candidates {
			if strings.HasPrefix(c, typed) && len(fits) < 3 {
				fits = append(fits, c)
			}
		}
	}
	if len(fits) == 0 {
		return ""
	}
	return " (did you mean " + strings.Join(fits, " or ") + "?)"
}

// editDistance is Levenshtein's distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
