// Command gentrace writes a generated busy node's usage trace as JSON
// lines (what `gcagent trace export` writes), for `gcagent replay`:
//
//	go run ./internal/tracegen/gentrace -o busy-node.jsonl
//
// Its flags change the model's parameters (tracegen.Params); the
// defaults are a busy node's month.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gcagent/gcagent/internal/tracegen"
	"github.com/gcagent/gcagent/trace"
)

func main() {
	p := tracegen.DefaultParams()
	out := flag.String("o", "-", "output file (- for standard output)")
	flag.Uint64Var(&p.Seed, "seed", p.Seed, "random seed")
	flag.IntVar(&p.Days, "days", p.Days, "days in the trace")
	flag.IntVar(&p.Images, "images", p.Images, "distinct images")
	flag.IntVar(&p.Runs, "runs", p.Runs, "containers started over the trace (about)")
	flag.Float64Var(&p.Zipf, "zipf", p.Zipf, "Zipf exponent of image popularity")
	capGiB := flag.Uint64("capacity-gib", p.Capacity>>30, "image filesystem size, GiB")
	flag.DurationVar(&p.MeanLife, "mean-life", p.MeanLife, "mean time an image version stays in use")
	flag.Parse()
	p.Capacity = *capGiB << 30
	p.Other = p.Capacity / 10
	if err := run(p, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gentrace:", err)
		os.Exit(1)
	}
}

func run(p tracegen.Params, out string) error {
	start := time.Now()
	recs := tracegen.Generate(p)
	w := os.Stdout
	if out != "-" {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriter(w)
	h := trace.Record{Node: fmt.Sprintf("generated-seed%d-zipf%.1f-life%s", p.Seed, p.Zipf, p.MeanLife)}
	if err := trace.Export(bw, h, recs); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gentrace: %d records in %s\n", len(recs), time.Since(start).Round(time.Millisecond))
	return nil
}
