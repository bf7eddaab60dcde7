package replay

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/trace"
)

// The flags of `gcagent run` a replay takes and sweeps, by name.
const (
	FlagHigh   = "image-gc-high-threshold"
	FlagLow    = "image-gc-low-threshold"
	FlagMinAge = "minimum-image-ttl-duration"
	FlagMaxAge = "image-maximum-gc-age"
	FlagKeep   = "keep-image"
	FlagPause  = "sandbox-image"
)

// Given returns a replay's Options.Policy: the recorded policy (p before
// the trace recorded one) with the flags given (given reports them) set
// from p. The sandbox image given is added to those the agent learned.
func Given(p gc.ImagePolicy, given func(flag string) bool) func(*trace.Policy) gc.ImagePolicy {
	return func(rec *trace.Policy) gc.ImagePolicy {
		if rec == nil {
			return p
		}
		out := PolicyOf(*rec)
		if given(FlagHigh) {
			out.HighThresholdPercent = p.HighThresholdPercent
		}
		if given(FlagLow) {
			out.LowThresholdPercent = p.LowThresholdPercent
		} else {
			// The high threshold alone: the recorded low one follows it
			// down where it would exceed it, as in plan.
			out.LowThresholdPercent = gc.LowFollowing(rec.High, rec.Low, out.HighThresholdPercent)
		}
		if given(FlagMinAge) {
			out.MinAge = p.MinAge
		}
		if given(FlagMaxAge) {
			out.MaxAge = p.MaxAge
		}
		if given(FlagKeep) {
			out.KeepPatterns = slices.Clone(p.KeepPatterns)
		}
		if given(FlagPause) {
			for _, s := range p.SandboxImages {
				if !slices.Contains(out.SandboxImages, s) {
					out.SandboxImages = append(out.SandboxImages, s)
				}
			}
		}
		return out
	}
}

// Sweep is one flag's values: --sweep FLAG=A..B[:STEP].
type Sweep struct {
	Flag   string
	Values []string
}

// maxSweep bounds a sweep's points.
const maxSweep = 200

// ParseSweep reads FLAG=A..B[:STEP]: the thresholds in percent (step 1
// by default), the ages as durations (step required).
func ParseSweep(s string) (Sweep, error) {
	flag, rng, ok := strings.Cut(s, "=")
	flag = strings.TrimPrefix(flag, "--")
	lo, rest, ok2 := strings.Cut(rng, "..")
	if !ok || !ok2 {
		return Sweep{}, fmt.Errorf("--sweep %q: want FLAG=A..B[:STEP], e.g. %s=70..95:5", s, FlagHigh)
	}
	hi, step, _ := strings.Cut(rest, ":")
	sw := Sweep{Flag: flag}
	switch flag {
	case FlagHigh, FlagLow:
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		st := 1
		var err3 error
		if step != "" {
			st, err3 = strconv.Atoi(step)
		}
		if err := cmpErr(err1, err2, err3); err != nil || a < 0 || b > 100 || a > b || st <= 0 {
			return Sweep{}, fmt.Errorf("--sweep %q: want percents A <= B within 0..100 and a positive step", s)
		}
		for v := a; v <= b && len(sw.Values) <= maxSweep; v += st {
			sw.Values = append(sw.Values, strconv.Itoa(v))
		}
	case FlagMinAge, FlagMaxAge:
		a, err1 := time.ParseDuration(lo)
		b, err2 := time.ParseDuration(hi)
		st, err3 := time.ParseDuration(step)
		if err := cmpErr(err1, err2, err3); err != nil || a < 0 || a > b || st <= 0 {
			return Sweep{}, fmt.Errorf("--sweep %q: want durations A <= B and a positive STEP, e.g. %s=0s..1h:10m", s, flag)
		}
		for v := a; v <= b && len(sw.Values) <= maxSweep; v += st {
			sw.Values = append(sw.Values, v.String())
		}
	default:
		return Sweep{}, fmt.Errorf("--sweep %q: unknown flag %q (one of %s, %s, %s, %s)", s, flag, FlagHigh, FlagLow, FlagMinAge, FlagMaxAge)
	}
	if len(sw.Values) > maxSweep {
		return Sweep{}, fmt.Errorf("--sweep %q: more than %d values", s, maxSweep)
	}
	return sw, nil
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// set returns policy with the swept flag at value v. Sweeping the high
// threshold takes the low one down with it where it would exceed it
// (gc.LowFollowing: the same gap), unless lowGiven: each row is what
// `replay --image-gc-high-threshold=V` replays. A sweep that makes the
// policy invalid says so.
func (sw Sweep) set(p gc.ImagePolicy, v string, lowGiven bool) (gc.ImagePolicy, error) {
	switch sw.Flag {
	case FlagHigh:
		n, _ := strconv.Atoi(v)
		if !lowGiven {
			p.LowThresholdPercent = gc.LowFollowing(p.HighThresholdPercent, p.LowThresholdPercent, n)
		}
		p.HighThresholdPercent = n
	case FlagLow:
		p.LowThresholdPercent, _ = strconv.Atoi(v)
	case FlagMinAge:
		p.MinAge, _ = time.ParseDuration(v)
	case FlagMaxAge:
		p.MaxAge, _ = time.ParseDuration(v)
	}
	return p, p.Validate()
}

// Point is one replay of a sweep.
type Point struct {
	Value  string       `json:"value"`
	Policy trace.Policy `json:"policy"`
	Error  string       `json:"error,omitempty"`
	// Frontier says no other point keeps more of the disk free and
	// re-pulls fewer bytes.
	Frontier bool    `json:"frontier"`
	Replayed Outcome `json:"replayed"`
}

// SweepResult is a sweep: the recorded outcome and one point per value.
type SweepResult struct {
	Flag     string    `json:"flag"`
	Order    string    `json:"order"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	Records  int       `json:"records"`
	Images   int       `json:"images"`
	Recorded Outcome   `json:"recorded"`
	// DryRun is Result.DryRun: how long the agent ran as a dry run.
	DryRun time.Duration `json:"dryRunNs,omitempty"`
	Points []Point       `json:"points"`
}

// RunSweep replays recs once per value of sw, in parallel, each with
// o's policy and the swept flag set. lowGiven: the low threshold was
// given, so a sweep of the high one keeps it.
func RunSweep(recs []trace.Record, o Options, sw Sweep, lowGiven bool) SweepResult {
	base := o.Policy
	if base == nil {
		base = Given(DefaultPolicy(), func(string) bool { return false })
	}
	pts := make([]Point, len(sw.Values))
	var recorded Result
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, v := range sw.Values {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var bad error
			oo := o
			oo.Policy = func(rec *trace.Policy) gc.ImagePolicy {
				p, err := sw.set(base(rec), v, lowGiven)
				if err != nil && bad == nil {
					bad = err
				}
				return p
			}
			pts[i].Value = v
			if _, err := sw.set(base(nil), v, lowGiven); err != nil {
				pts[i].Error = err.Error()
				return
			}
			res := Simulate(recs, oo)
			pts[i].Policy, pts[i].Replayed = res.Policy, res.Replayed
			if bad != nil {
				pts[i].Error = bad.Error()
			}
			if i == 0 {
				recorded = res
			}
		}()
	}
	wg.Wait()
	if len(sw.Values) == 0 || pts[0].Error != "" {
		recorded = Simulate(recs, Options{})
	}
	markFrontier(pts)
	return SweepResult{Flag: sw.Flag, Order: cmpOrder(o.Order), From: recorded.From, To: recorded.To, Records: recorded.Records,
		Images: recorded.Images, Recorded: recorded.Recorded, DryRun: recorded.DryRun, Points: pts}
}

// markFrontier marks the points no other beats on both free space and
// re-pulled bytes.
func markFrontier(pts []Point) {
	for i := range pts {
		if pts[i].Error != "" {
			continue
		}
		a := pts[i].Replayed
		pts[i].Frontier = !slices.ContainsFunc(pts, func(q Point) bool {
			b := q.Replayed
			return q.Error == "" && b.MeanFree >= a.MeanFree && b.RepulledBytes <= a.RepulledBytes &&
				(b.MeanFree > a.MeanFree || b.RepulledBytes < a.RepulledBytes)
		})
	}
}

func cmpOrder(o string) string {
	if o == "" {
		return OrderLRU
	}
	return o
}
