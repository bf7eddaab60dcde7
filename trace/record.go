// Package trace is the node's usage trace: what image GC needs to be
// replayed (package replay). Each record says when an image arrived in a
// containerd namespace (its names, size, pinned), when a container first
// started holding it (use) and when the last one let go (idle), when it
// left the node and who removed it, what the image filesystem's capacity
// and availability were, and which image GC policy was in force.
//
// The agent derives the records from the projection's events as it
// applies them (no call of its own to containerd) and stores them in the
// state file, in the journal's own transactions (Log). The trace is
// bounded by age and size: what falls out of the window is folded into a
// base, the images present at the window's start. Export writes it as
// JSON lines, one Record each (docs/replay.md), so that traces of many
// nodes can be pooled.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"time"
)

// Version is the trace format's version, in the header of an export.
const Version = 1

// Kind says what a record is.
type Kind string

// Record kinds. They are stored and exported: never rename one.
const (
	// KindHeader opens an export: the format's version, the node, the
	// window.
	KindHeader Kind = "trace"
	// KindImage: an image arrived in a namespace (T is when the agent
	// first saw it), or its names, size or pin changed. A record of an
	// image present before the window (the base) says when it was first
	// seen and last used.
	KindImage Kind = "image"
	// KindUse: a container started holding the image (it was held by
	// none).
	KindUse Kind = "use"
	// KindIdle: the last container holding it went (T is the image's last
	// use, as image GC counts it).
	KindIdle Kind = "idle"
	// KindRemoved: the image left the namespace; By says whether this
	// agent's image GC removed it (with Rule, Trigger and the bytes Freed
	// on the filesystem) or someone else did. Read and Export make it
	// from the two records the agent stores (KindGone, KindGC).
	KindRemoved Kind = "removed"
	// KindDisk: a measurement of the image filesystem: recorded when its
	// usage moves by a percent (at most once a second), and at the start
	// of every image GC pass (Trigger says why the pass ran).
	KindDisk Kind = "disk"
	// KindPolicy: the image GC policy in force from T on.
	KindPolicy Kind = "policy"
	// KindStart: the agent started (what happened while it was down is
	// recorded when its first listing finds it).
	KindStart Kind = "start"

	// KindGone and KindGC are what the agent stores of a removal: the
	// image left the projection; its image GC deleted it. They are
	// paired into KindRemoved when read (Canonical).
	KindGone Kind = "gone"
	KindGC   Kind = "gc"
)

// Who removed an image (Record.By).
const (
	ByAgent = "gcagent"
	ByOther = "other"
)

// Record is one line of a trace. Which fields are set depends on Ev; the
// JSON names are the format's (docs/replay.md).
type Record struct {
	T  time.Time `json:"t"`
	Ev Kind      `json:"ev"`
	// NS is the containerd namespace of an image record.
	NS     string `json:"ns,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Names are all the image's names, sorted (image, gc).
	Names []string `json:"names,omitempty"`
	// Size is the image's size as the kubelet counts it: the bytes of its
	// content, which a pull fetches.
	Size   int64 `json:"size,omitempty"`
	Pinned bool  `json:"pinned,omitempty"`
	// FirstSeen and LastUsed are set on an image record when they are not
	// T and never: an image present before the window, or before the
	// trace began. Used says it was held by a container then.
	FirstSeen time.Time `json:"firstSeen,omitzero"`
	LastUsed  time.Time `json:"lastUsed,omitzero"`
	Used      bool      `json:"used,omitempty"`

	// By, Rule, Trigger and Freed describe a removal: Rule is the
	// planner's (space, max-age), Trigger what started the pass (disk,
	// max-age, episode, manual...), Freed the bytes the filesystem gained,
	// measured (0: unknown). Trigger is also set on the disk record taken
	// at the start of a pass.
	By      string `json:"by,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Trigger string `json:"trigger,omitempty"`
	Freed   int64  `json:"freed,omitempty"`

	Disk   *Disk   `json:"disk,omitempty"`
	Policy *Policy `json:"policy,omitempty"`

	// Header fields. Skipped says what the stored trace held that could
	// not be read and is not in the export.
	Version int       `json:"version,omitempty"`
	Node    string    `json:"node,omitempty"`
	Cluster string    `json:"cluster,omitempty"`
	From    time.Time `json:"from,omitzero"`
	To      time.Time `json:"to,omitzero"`
	Skipped *Skipped  `json:"skipped,omitempty"`
}

// Disk is a measurement of the image filesystem, in bytes, as statfs gives
// it.
type Disk struct {
	Capacity  uint64 `json:"capacity"`
	Available uint64 `json:"available"`
}

// Usage is the kubelet's usage in percent, rounded up; 0 for a zero
// capacity.
func (d Disk) Usage() int {
	if d.Capacity == 0 {
		return 0
	}
	avail := min(d.Available, d.Capacity)
	return 100 - int(mulDiv(avail, 100, d.Capacity))
}

// Used is the bytes in use.
func (d Disk) Used() uint64 { return d.Capacity - min(d.Available, d.Capacity) }

// Policy is the image GC policy in force (the flags of `gcagent run`, the
// sandbox images it learned, the fleet keep list it applied).
type Policy struct {
	High              int      `json:"high"`
	Low               int      `json:"low"`
	MinAge            Duration `json:"minAge"`
	MaxAge            Duration `json:"maxAge"`
	SandboxImages     []string `json:"sandboxImages,omitempty"`
	KeepPatterns      []string `json:"keepPatterns,omitempty"`
	FleetKeepPatterns []string `json:"fleetKeepPatterns,omitempty"`
	// Order is the deletion order of threshold GC; empty is least
	// recently used first.
	Order  string `json:"order,omitempty"`
	DryRun bool   `json:"dryRun,omitempty"`
}

// Equal reports whether two policies say the same.
func (p Policy) Equal(q Policy) bool {
	return p.High == q.High && p.Low == q.Low && p.MinAge == q.MinAge && p.MaxAge == q.MaxAge &&
		slices.Equal(p.SandboxImages, q.SandboxImages) && slices.Equal(p.KeepPatterns, q.KeepPatterns) &&
		slices.Equal(p.FleetKeepPatterns, q.FleetKeepPatterns) && p.Order == q.Order && p.DryRun == q.DryRun
}

// Duration is a time.Duration written as Go writes one ("2m0s").
type Duration time.Duration

// MarshalText writes d as "1h2m3s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// key is an image's identity in a trace: its namespace and target digest.
type key struct{ ns, digest string }

func (r *Record) key() key { return key{r.NS, r.Digest} }

// Encode writes recs to w as JSON lines.
func Encode(w io.Writer, recs ...Record) error {
	var b []byte
	for i := range recs {
		var err error
		if b, err = appendRecord(b[:0], &recs[i]); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// appendJSON appends recs to b as JSON lines.
func appendJSON(b []byte, recs []Record) ([]byte, error) {
	for i := range recs {
		var err error
		if b, err = appendRecord(b, &recs[i]); err != nil {
			return b, err
		}
	}
	return b, nil
}

// Decode reads JSON lines from r and calls fn with each record. A line
// that is not a record (malformed JSON, no time or kind) is passed to bad
// with its line number and skipped; a nil bad makes it an error. A line
// of maxLine bytes or more, or a reader that fails, is an error. It stops
// at fn's first error. The trace's writer stores nothing Decode refuses.
func Decode(r io.Reader, fn func(Record) error, bad func(line int, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var rec Record
		err := json.Unmarshal(line, &rec)
		if err == nil {
			err = refusal(&rec)
		}
		if err != nil {
			if bad == nil {
				return fmt.Errorf("trace line %d: %w", n, err)
			}
			bad(n, err)
			continue
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	return sc.Err()
}

// mulDiv returns a*b/c rounded down, exact whenever the result fits in
// 64 bits (c > 0).
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, _ := bits.Div64(hi, lo, c)
	return q
}
