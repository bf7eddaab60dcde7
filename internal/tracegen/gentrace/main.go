// Command gentrace writes a generated busy node's usage trace as JSON
// lines (what `gcagent trace export` writes), for `gcagent replay`:
//
//	go run ./internal/tracegen/gentrace -o busy-node.jsonl
//	go run ./internal/tracegen/gentrace -declared -o declared.jsonl -keep-list declared-keep.json
//
// Its flags change the model's parameters (tracegen.Params); the
// defaults are a busy node's month. -declared adds CronJobs,
// scale-to-zero workloads and rollbacks (tracegen.DeclaredParams), and
// -keep-list writes the cluster keep list they declare, as `gcagent ctl
// keep ls --json` prints it, for `gcagent replay --keep-list`.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gcagent/gcagent/declared"
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
	mix := flag.Bool("declared", false, "add the declared workloads of tracegen.DeclaredParams (20 CronJobs, 20 scale-to-zero, 10 rollbacks)")
	flag.IntVar(&p.Declared.CronJobs, "cronjobs", 0, "CronJobs, each running its image every hour")
	flag.IntVar(&p.Declared.ScaleToZero, "scale-to-zero", 0, "workloads holding their image by day, none by night")
	flag.IntVar(&p.Declared.Rollbacks, "rollbacks", 0, "services rolled out to v2, then back to v1 days later")
	keep := flag.String("keep-list", "", "also write the cluster keep list the declared workloads make to this file (ctl keep ls --json's form)")
	flag.Parse()
	p.Capacity = *capGiB << 30
	p.Other = p.Capacity / 10
	if *mix {
		d := tracegen.DeclaredParams().Declared
		p.Declared.CronJobs = max(p.Declared.CronJobs, d.CronJobs)
		p.Declared.ScaleToZero = max(p.Declared.ScaleToZero, d.ScaleToZero)
		p.Declared.Rollbacks = max(p.Declared.Rollbacks, d.Rollbacks)
	}
	if err := run(p, *out, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "gentrace:", err)
		os.Exit(1)
	}
}

// writeKeep writes the keep list p's declared workloads make, as `gcagent
// ctl keep ls --json` prints the cluster keep list.
func writeKeep(p tracegen.Params, file string) error {
	var images []declared.ShardImage
	for _, e := range tracegen.KeepList(p) {
		im := declared.ShardImage{Ref: e.Image, N: len(e.By)}
		for _, w := range e.By {
			im.By = append(im.By, w.String())
		}
		images = append(images, im)
	}
	b, err := json.Marshal(map[string]any{"declared": map[string]any{"images": images}})
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

func run(p tracegen.Params, out, keep string) error {
	start := time.Now()
	if keep != "" {
		if err := writeKeep(p, keep); err != nil {
			return err
		}
	}
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
	if d := p.Declared; d != (tracegen.Workloads{}) {
		h.Node += fmt.Sprintf("-cron%d-stz%d-rb%d", d.CronJobs, d.ScaleToZero, d.Rollbacks)
	}
	if err := trace.Export(bw, h, recs); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gentrace: %d records in %s\n", len(recs), time.Since(start).Round(time.Millisecond))
	return nil
}
