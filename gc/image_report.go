package gc

import (
	"strings"

	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/schema"
)

// How an image GC pass is told: its log lines and events, held until it is
// known whether the pass is news, and its payloads.

// passReport holds a pass's log lines and events until it is known whether
// the pass is news; a quiet flush logs them at debug and publishes nothing.
// After a loud flush, what is added goes out at once.
type passReport struct {
	held []func(quiet bool)
	live bool
}

func (r *passReport) add(f func(quiet bool)) {
	if r.live {
		f(false)
		return
	}
	r.held = append(r.held, f)
}

func (r *passReport) flush(quiet bool) {
	for _, f := range r.held {
		f(quiet)
	}
	r.held, r.live = nil, r.live || !quiet
}

// level is lvl, or debug for a quiet report.
func level(lvl zerolog.Level, quiet bool) zerolog.Level {
	if quiet {
		return zerolog.DebugLevel
	}
	return lvl
}

// passOutcome sums up what a pass that removed nothing found: the images
// planned, each skip's reason, and the error. Two passes with the same
// outcome tell the fleet the same thing.
func passOutcome(plan ImagePlan, p ImagePass) string {
	var b strings.Builder
	b.WriteString("planned:")
	for _, it := range plan.Delete {
		b.WriteString(" " + it.Digest)
	}
	b.WriteString("\nskipped:")
	for _, o := range p.Skipped {
		b.WriteString(" " + o.Digest + "=" + string(o.Reason))
	}
	b.WriteString("\nerror: " + p.Error)
	return b.String()
}

// imageData is schema.ImageEvent (the payload lives in package schema).
type imageData = schema.ImageEvent

// passSummary is schema.GCPass (the payload lives in package schema).
type passSummary = schema.GCPass

func passData(p ImagePass) passSummary {
	return passSummary{Start: p.Start, End: p.End, Trigger: p.Trigger, DryRun: p.DryRun, Usage: p.Usage,
		AmountToFree: p.AmountToFree, Planned: p.Planned, Removed: len(p.Removed), Skipped: len(p.Skipped),
		EstimatedBytes: p.EstimatedBytes, FreedBytes: p.FreedBytes, UsageAfter: p.UsageAfter,
		Shortfall: p.Shortfall, FirstEligibleAt: p.FirstEligibleAt, Error: p.Error}
}

func (g *ImageGC) publish(a Action, log zerolog.Logger) {
	if err := g.d.Publisher.Publish(a); err != nil {
		log.Warn().Err(err).Str("kind", a.Kind).Str("action", a.Action).Msg("publish failed")
	}
}

func firstName(names []string) string {
	// Prefer a readable name over CRI's sha256: id.
	for _, n := range names {
		if len(n) < 7 || n[:7] != "sha256:" {
			return n
		}
	}
	if len(names) > 0 {
		return names[0]
	}
	return ""
}
