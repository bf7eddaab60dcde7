package main

import (
	"regexp"
	"strings"
	"testing"
)

// stream is a `go test -json` run of two packages, interleaved: a pass with
// two subtests, a failure, a skip, a test cut off by a timeout panic.
const stream = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestSlow"}
{"Action":"output","Package":"m/a","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}
{"Action":"run","Package":"m/a","Test":"TestSlow/containerd-1.6"}
{"Action":"output","Package":"m/a","Test":"TestSlow/containerd-1.6","Output":"    slow_test.go:9: fine\n"}
{"Action":"start","Package":"m/b"}
{"Action":"run","Package":"m/b","Test":"TestBroken"}
{"Action":"output","Package":"m/b","Test":"TestBroken","Output":"=== RUN   TestBroken\n"}
{"Action":"output","Package":"m/b","Test":"TestBroken","Output":"    broken_test.go:3: want 1, got 2\n"}
{"Action":"output","Package":"m/b","Test":"TestBroken","Output":"--- FAIL: TestBroken (0.50s)\n"}
{"Action":"fail","Package":"m/b","Test":"TestBroken","Elapsed":0.5}
{"Action":"output","Package":"m/b","Test":"TestSkipped","Output":"--- SKIP: TestSkipped (0.00s)\n    x_test.go:7: needs root\n"}
{"Action":"skip","Package":"m/b","Test":"TestSkipped","Elapsed":0}
{"Action":"output","Package":"m/b","Output":"FAIL\n"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b\t0.6s\n"}
{"Action":"fail","Package":"m/b","Elapsed":0.6}
{"Action":"pass","Package":"m/a","Test":"TestSlow/containerd-1.6","Elapsed":40.2}
{"Action":"run","Package":"m/a","Test":"TestSlow/containerd-2.3"}
{"Action":"pass","Package":"m/a","Test":"TestSlow/containerd-2.3","Elapsed":41}
{"Action":"pass","Package":"m/a","Test":"TestSlow","Elapsed":41.3}
{"Action":"run","Package":"m/a","Test":"TestParallelDaemons"}
{"Action":"run","Package":"m/a","Test":"TestParallelDaemons/containerd-1.6"}
{"Action":"pause","Package":"m/a","Test":"TestParallelDaemons/containerd-1.6"}
{"Action":"run","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3"}
{"Action":"pause","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3"}
{"Action":"cont","Package":"m/a","Test":"TestParallelDaemons/containerd-1.6"}
{"Action":"cont","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3"}
{"Action":"run","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3/case"}
{"Action":"pass","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3/case","Elapsed":7}
{"Action":"pass","Package":"m/a","Test":"TestParallelDaemons/containerd-2.3","Elapsed":3}
{"Action":"pass","Package":"m/a","Test":"TestParallelDaemons/containerd-1.6","Elapsed":5}
{"Action":"pass","Package":"m/a","Test":"TestParallelDaemons","Elapsed":0}
{"Action":"run","Package":"m/a","Test":"TestFast"}
{"Action":"output","Package":"m/a","Test":"TestFast","Output":"    fast_test.go:1: quiet\n"}
{"Action":"pass","Package":"m/a","Test":"TestFast","Elapsed":0.01}
{"Action":"run","Package":"m/a","Test":"TestHangs"}
{"Action":"output","Package":"m/a","Test":"TestHangs","Output":"    hangs_test.go:4: waiting\n"}
{"Action":"output","Package":"m/a","Output":"panic: test timed out after 1m0s\n"}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t60.0s\n"}
{"Action":"fail","Package":"m/a","Elapsed":60}
`

func TestReport(t *testing.T) {
	var out strings.Builder
	r := NewReport(&out)
	if err := r.Read(strings.NewReader("make: entering\n" + stream)); err != nil {
		t.Fatal(err)
	}
	r.WriteSlowest(3)
	want := `make: entering
    broken_test.go:3: want 1, got 2
--- FAIL: TestBroken (0.50s)
--- SKIP: TestSkipped (0.00s)
    x_test.go:7: needs root
FAIL
FAIL	m/b	0.6s
    hangs_test.go:4: waiting
panic: test timed out after 1m0s
FAIL	m/a	60.0s

the 3 slowest tests:
    41.3s  a            TestSlow  [containerd-1.6 40.2s, containerd-2.3 41.0s]
     7.0s  a            TestParallelDaemons  [containerd-1.6 5.0s, containerd-2.3 7.0s]
     0.5s  b            TestBroken (FAIL)
`
	if got := out.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	if !r.Failed() {
		t.Error("a failed run reported as passed")
	}
}

func TestReportPassesOnlyAllPassed(t *testing.T) {
	for name, in := range map[string]string{
		"passed":   `{"Action":"pass","Package":"m/a","Test":"TestA","Elapsed":1}` + "\n" + `{"Action":"pass","Package":"m/a","Elapsed":1}`,
		"empty":    "",
		"no json":  "go: cannot find main module\n",
		"build":    `{"ImportPath":"m/a","Action":"build-output","Output":"a.go:1: syntax error\n"}` + "\n" + `{"ImportPath":"m/a","Action":"build-fail"}`,
		"pkg fail": `{"Action":"fail","Package":"m/a","Elapsed":1}`,
	} {
		r := NewReport(&strings.Builder{})
		if err := r.Read(strings.NewReader(in)); err != nil {
			t.Fatal(err)
		}
		if got, want := r.Failed(), name != "passed"; got != want {
			t.Errorf("%s: failed %v, want %v", name, got, want)
		}
	}
}

func TestReportVerbose(t *testing.T) {
	var out strings.Builder
	r := NewReport(&out)
	r.Verbose = regexp.MustCompile(`^m/a$`)
	if err := r.Read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"=== RUN   TestSlow\n", "    slow_test.go:9: fine\n", "    fast_test.go:1: quiet\n", "    broken_test.go:3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verbose output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "=== RUN   TestBroken") {
		t.Errorf("output of m/b, not verbose, holds its frames:\n%s", out.String())
	}
}
