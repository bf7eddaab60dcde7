package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent), with
// the build events `go test -json` adds (Action build-output, build-fail).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64 // seconds, on pass and fail
	Output     string
	ImportPath string // build-output, build-fail
}

// result is a finished test.
type result struct {
	Package, Test string
	Action        string // pass, fail, skip
	Elapsed       time.Duration
}

// Report follows a `go test -json` stream: it writes what plain `go test`
// writes (each package's result line, the output of every test that failed
// or was skipped, build errors) as the events come, and keeps every test's
// result for Slowest. Not safe for concurrent use.
type Report struct {
	// Verbose, when set, names the packages whose tests' output is written
	// as it comes, passing or not, as `go test -v` writes it.
	Verbose *regexp.Regexp

	w       io.Writer
	out     map[string][]string // output of tests still running, by package and test
	results []result
	failed  bool // a test, a package or a build failed
	events  int
}

// NewReport returns a Report that writes to w.
func NewReport(w io.Writer) *Report {
	return &Report{w: w, out: map[string][]string{}}
}

// Read feeds every line of in to the report. A line that is not a JSON
// event (what a test binary printed past test2json, a make line) is
// written as it is.
func (r *Report) Read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintln(r.w, string(line))
			continue
		}
		r.Add(ev)
	}
	return sc.Err()
}

// Add takes one event.
func (r *Report) Add(ev event) {
	r.events++
	key := ev.Package + "\x00" + ev.Test
	switch ev.Action {
	case "build-output":
		fmt.Fprint(r.w, ev.Output)
	case "build-fail":
		r.failed = true
	case "output":
		if ev.Test == "" {
			// The package's own lines: "ok  pkg 1.2s", "FAIL pkg", a
			// panic outside any test. Plain `go test` prints these;
			// "PASS" alone it leaves out.
			if strings.HasPrefix(ev.Output, "panic: ") || strings.HasPrefix(ev.Output, "FAIL") {
				r.flushRunning(ev.Package) // first what the tests a panic or timeout ended said
			}
			if ev.Output != "PASS\n" {
				fmt.Fprint(r.w, ev.Output)
			}
			return
		}
		if r.Verbose != nil && r.Verbose.MatchString(ev.Package) {
			fmt.Fprint(r.w, ev.Output)
		} else if !isFrame(ev.Output) {
			r.out[key] = append(r.out[key], ev.Output)
		}
	case "pass", "fail", "skip":
		if ev.Test == "" {
			if ev.Action == "fail" {
				r.failed = true
				r.flushRunning(ev.Package)
			}
			return
		}
		r.results = append(r.results, result{Package: ev.Package, Test: ev.Test, Action: ev.Action,
			Elapsed: time.Duration(ev.Elapsed * float64(time.Second))})
		if ev.Action == "fail" {
			r.failed = true
		}
		if ev.Action != "pass" {
			fmt.Fprint(r.w, strings.Join(r.out[key], ""))
		}
		delete(r.out, key)
	}
}

// flushRunning writes the output of the tests of pkg that never finished.
func (r *Report) flushRunning(pkg string) {
	var keys []string
	for k := range r.out {
		if strings.HasPrefix(k, pkg+"\x00") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprint(r.w, strings.Join(r.out[k], ""))
		delete(r.out, k)
	}
}

// isFrame is a line test2json's verbose mode adds and plain `go test`
// does not print: === RUN, PAUSE, CONT, NAME.
func isFrame(line string) bool {
	for _, p := range []string{"=== RUN ", "=== PAUSE ", "=== CONT ", "=== NAME "} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

// Failed reports whether a test, a package or a build failed, or the
// stream held no event at all (go test did not run).
func (r *Report) Failed() bool { return r.failed || r.events == 0 }

// Slowest returns the n slowest top-level tests, slowest first (ties by
// package and name), each with its direct subtests. A test's time is what
// go test reports, or its slowest subtest's when that is longer: the time
// of a test whose subtests ran in parallel leaves them out.
func (r *Report) Slowest(n int) []Ranked {
	children := map[string][]result{} // by package and parent name
	var tops []result
	for _, res := range r.results {
		i := strings.LastIndexByte(res.Test, '/')
		if i < 0 {
			tops = append(tops, res)
			continue
		}
		k := res.Package + "\x00" + res.Test[:i]
		children[k] = append(children[k], res)
	}
	var span func(res result) time.Duration
	span = func(res result) time.Duration {
		d := res.Elapsed
		for _, c := range children[res.Package+"\x00"+res.Test] {
			d = max(d, span(c))
		}
		return d
	}
	ranked := make([]Ranked, len(tops))
	for i, t := range tops {
		ranked[i] = Ranked{result: t, Time: span(t)}
		for _, c := range children[t.Package+"\x00"+t.Test] {
			c.Elapsed = span(c)
			ranked[i].Subtests = append(ranked[i].Subtests, c)
		}
		slices.SortFunc(ranked[i].Subtests, func(a, b result) int { return cmp.Compare(a.Test, b.Test) })
	}
	slices.SortFunc(ranked, func(a, b Ranked) int {
		return cmp.Or(cmp.Compare(b.Time, a.Time), cmp.Compare(a.Package, b.Package), cmp.Compare(a.Test, b.Test))
	})
	return ranked[:min(n, len(ranked))]
}

// Ranked is a top-level test and its direct subtests.
type Ranked struct {
	result
	Time     time.Duration // Elapsed, or its slowest subtest's when longer
	Subtests []result      // each with its own Time as Elapsed
}

// maxSubtests is how many subtests a line of the ranking names: the
// per-daemon runs of an end-to-end test, not a table of cases.
const maxSubtests = 4

// WriteSlowest writes the n slowest top-level tests, one a line: time,
// package (its last element), name, and its subtests' times when it has
// a few (a test per daemon shows both runs).
func (r *Report) WriteSlowest(n int) {
	ranked := r.Slowest(n)
	if len(ranked) == 0 {
		return
	}
	fmt.Fprintf(r.w, "\nthe %d slowest tests:\n", len(ranked))
	for _, t := range ranked {
		line := fmt.Sprintf("%8.1fs  %-12s %s", t.Time.Seconds(), shortPkg(t.Package), t.Test)
		if t.Action != "pass" {
			line += " (" + strings.ToUpper(t.Action) + ")"
		}
		if k := len(t.Subtests); k > 0 && k <= maxSubtests {
			var parts []string
			for _, s := range t.Subtests {
				parts = append(parts, fmt.Sprintf("%s %.1fs", strings.TrimPrefix(s.Test, t.Test+"/"), s.Elapsed.Seconds()))
			}
			line += "  [" + strings.Join(parts, ", ") + "]"
		}
		fmt.Fprintln(r.w, line)
	}
}

// shortPkg is a package path's last element.
func shortPkg(p string) string {
	return p[strings.LastIndexByte(p, '/')+1:]
}
