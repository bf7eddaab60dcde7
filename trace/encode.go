package trace

import (
	"encoding/json"
	"strconv"
	"time"
)

// appendRecord appends r as one JSON line, exactly as encoding/json
// writes it (Encode), without reflection for the records the projection
// makes by the thousand (image, use, idle, gone, gc): the trace must cost
// the agent no measurable CPU per event. Any other record, or a string
// that would need escaping, goes through encoding/json.
func appendRecord(b []byte, r *Record) ([]byte, error) {
	b, _, err := appendLine(b, r)
	return b, err
}

// appendLine is appendRecord, and says whether encoding/json wrote the
// line.
func appendLine(b []byte, r *Record) (_ []byte, viaJSON bool, err error) {
	if !fast(r) {
		line, err := json.Marshal(r)
		if err != nil {
			return b, true, err
		}
		return append(append(b, line...), '\n'), true, nil
	}
	b = append(b, `{"t":`...)
	b = appendTime(b, r.T)
	b = appendStr(append(b, `,"ev":`...), string(r.Ev))
	if r.NS != "" {
		b = appendStr(append(b, `,"ns":`...), r.NS)
	}
	if r.Digest != "" {
		b = appendStr(append(b, `,"digest":`...), r.Digest)
	}
	if len(r.Names) > 0 {
		b = append(b, `,"names":[`...)
		for i, n := range r.Names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendStr(b, n)
		}
		b = append(b, ']')
	}
	if r.Size != 0 {
		b = strconv.AppendInt(append(b, `,"size":`...), r.Size, 10)
	}
	if r.Pinned {
		b = append(b, `,"pinned":true`...)
	}
	if !r.FirstSeen.IsZero() {
		b = appendTime(append(b, `,"firstSeen":`...), r.FirstSeen)
	}
	if !r.LastUsed.IsZero() {
		b = appendTime(append(b, `,"lastUsed":`...), r.LastUsed)
	}
	if r.Used {
		b = append(b, `,"used":true`...)
	}
	for _, f := range [...]struct{ name, v string }{{`,"by":`, r.By}, {`,"rule":`, r.Rule}, {`,"trigger":`, r.Trigger}} {
		if f.v != "" {
			b = appendStr(append(b, f.name...), f.v)
		}
	}
	if r.Freed != 0 {
		b = strconv.AppendInt(append(b, `,"freed":`...), r.Freed, 10)
	}
	return append(b, "}\n"...), false, nil
}

// fast reports whether appendRecord writes r itself: a record of the
// projection's kinds whose strings need no escaping and whose times
// encoding/json writes as RFC 3339.
func fast(r *Record) bool {
	switch r.Ev {
	case KindImage, KindUse, KindIdle, KindGone, KindGC, KindRemoved:
	default:
		return false
	}
	if r.Disk != nil || r.Policy != nil || r.Version != 0 || r.Node != "" || r.Cluster != "" || !r.From.IsZero() || !r.To.IsZero() {
		return false
	}
	for _, t := range [...]time.Time{r.T, r.FirstSeen, r.LastUsed} {
		if y := t.Year(); y < 0 || y > 9999 {
			return false // encoding/json refuses these
		}
	}
	for _, s := range [...]string{string(r.Ev), r.NS, r.Digest, r.By, r.Rule, r.Trigger} {
		if !plain(s) {
			return false
		}
	}
	for _, n := range r.Names {
		if !plain(n) {
			return false
		}
	}
	return true
}

// plain reports whether s is printable ASCII that JSON writes as it is
// (encoding/json escapes <, > and & for HTML).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func appendStr(b []byte, s string) []byte {
	return append(append(append(b, '"'), s...), '"')
}

func appendTime(b []byte, t time.Time) []byte {
	return append(t.AppendFormat(append(b, '"'), time.RFC3339Nano), '"')
}
