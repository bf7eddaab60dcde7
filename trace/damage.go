package trace

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gcagent/gcagent/internal/promzero"
	"github.com/prometheus/client_golang/prometheus"
)

// What the trace cannot read: the writer refuses every record the strict
// reader (Decode) would refuse, so none is stored; a stored chunk that
// does not decode (written by an earlier version, damaged on disk) is
// dropped by the next compaction, which bounds the trace whatever it
// holds, and skipped by every read, which says so (Skipped).

// maxLine is the longest line Decode reads (its scanner's buffer): a
// longer one fails the whole chunk, so the writer refuses it.
const maxLine = 16 << 20

// errNoTimeOrKind is the strict reader's refusal of a line that decodes
// as JSON but is no record.
var errNoTimeOrKind = errors.New("no time or kind")

// refusal says why the strict reader refuses a decoded record (nil: it
// reads it): every record has a kind, and every one but an export's
// header a time.
func refusal(r *Record) error {
	if r.Ev == "" || r.T.IsZero() && r.Ev != KindHeader {
		return errNoTimeOrKind
	}
	return nil
}

// readable says why the strict reader would refuse line, r as
// appendRecord wrote it (viaJSON: by encoding/json, whose output is read
// back to be sure; the fast path writes only what decodes), nil if it
// reads it.
func readable(r *Record, line []byte, viaJSON bool) error {
	if len(line) >= maxLine {
		return fmt.Errorf("line of %d bytes: the reader takes less than %d", len(line), maxLine)
	}
	if !viaJSON {
		return refusal(r)
	}
	var back Record
	if err := json.Unmarshal(line, &back); err != nil {
		return err
	}
	return refusal(&back)
}

// Skipped says what a read of the stored trace could not decode and left
// out: chunks (the base counts as one) and single records.
type Skipped struct {
	Chunks  int `json:"chunks,omitempty"`
	Records int `json:"records,omitempty"`
	// First is the first of them: where, and why.
	First string `json:"first,omitempty"`
}

// Any reports whether anything was skipped.
func (s Skipped) Any() bool { return s.Chunks > 0 || s.Records > 0 }

// String says what was skipped, for people.
func (s Skipped) String() string {
	return fmt.Sprintf("%d chunks and %d records of the stored trace could not be read and were skipped (first: %s)",
		s.Chunks, s.Records, s.First)
}

// chunk notes a chunk that did not decode.
func (s *Skipped) chunk(where string, err error) {
	s.Chunks++
	s.first(where, err)
}

// record notes a record (line of a chunk) the reader refuses.
func (s *Skipped) record(where string, line int, err error) {
	s.Records++
	s.first(fmt.Sprintf("%s line %d", where, line), err)
}

func (s *Skipped) first(where string, err error) {
	if s.First == "" {
		s.First = where + ": " + err.Error()
	}
}

// Metrics are the trace's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	refused prometheus.Counter
	dropped *prometheus.CounterVec // what: chunk, record
}

// NewMetrics creates the metrics at zero and registers them with reg
// (nil: not registered). It fails if reg already holds them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gcagent_trace_records_refused_total",
			Help: "Usage trace records not stored because the trace's reader would refuse them (no time or kind, not encodable, too long).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gcagent_trace_dropped_total",
			Help: "Stored usage trace chunks (the base included) and records that did not decode, dropped by compaction, by what.",
		}, []string{"what"}),
	}
	promzero.Labels(m.dropped.WithLabelValues, []string{"chunk", "record"})
	if reg != nil {
		for _, c := range []prometheus.Collector{m.refused, m.dropped} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) refuse() {
	if m != nil {
		m.refused.Inc()
	}
}

func (m *Metrics) drop(s Skipped) {
	if m != nil {
		m.dropped.WithLabelValues("chunk").Add(float64(s.Chunks))
		m.dropped.WithLabelValues("record").Add(float64(s.Records))
	}
}
