// Command testreport reads `go test -json` on standard input and writes
// what plain `go test` would (each package's result, the output of the
// tests that failed or were skipped, build errors), then the slowest
// tests with their times. It exits 1 when a test, a package or a build
// failed, or when the input held no test event. `make test` pipes every
// `go test` through it:
//
//	go test -json ./... | go run ./internal/testreport
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
)

func main() {
	n := flag.Int("slowest", 10, "how many of the slowest tests to list")
	verbose := flag.String("v", "", "regexp of the packages whose tests' output is written in full, as go test -v writes it")
	flag.Parse()
	re, err := regexp.Compile(*verbose)
	if flag.NArg() > 0 || *n < 0 || err != nil {
		fmt.Fprintln(os.Stderr, "testreport: reads go test -json on stdin; flags: -slowest N, -v REGEXP")
		os.Exit(2)
	}
	r := NewReport(os.Stdout)
	if *verbose != "" {
		r.Verbose = re
	}
	if err := r.Read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	r.WriteSlowest(*n)
	if r.Failed() {
		os.Exit(1)
	}
}
