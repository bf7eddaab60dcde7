// Package promzero creates a metric vector's children for every known
// combination of label values at construction, so that a quiet node exports
// zeros, not absence: a dashboard shows 0 rather than "No data", increase()
// sees the first event, and a missing series means "not scraped".
package promzero

// Labels calls with (a vector's WithLabelValues) once for each combination
// of the value sets, in order: Labels(v.WithLabelValues, namespaces, kinds)
// creates every (namespace, kind) child. An empty set creates nothing.
func Labels[T any](with func(...string) T, sets ...[]string) {
	combo := make([]string, len(sets))
	var walk func(i int)
	walk = func(i int) {
		if i == len(sets) {
			with(combo...)
			return
		}
		for _, v := range sets[i] {
			combo[i] = v
			walk(i + 1)
		}
	}
	walk(0)
}
