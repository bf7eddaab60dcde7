package natsbus

import (
	"slices"
	"testing"
)

// TestDecodeKeep: only a delete (no value) or an explicit "patterns": []
// is an empty list; a value written wrongly is an error, so that an agent
// keeps the list it had instead of dropping every fleet pattern.
func TestDecodeKeep(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
		ok    bool
	}{
		{``, nil, true},
		{`{"patterns":[]}`, []string{}, true},
		{`{"patterns":["reg/app:*"],"updatedAt":"2026-11-26T12:00:00Z","updatedBy":"ops"}`, []string{"reg/app:*"}, true},
		{`{"images":["reg/app:*"]}`, nil, false},
		{`{"patterns":["a"],"images":["b"]}`, nil, false},
		{`{}`, nil, false},
		{`{"patterns":null}`, nil, false},
		{`null`, nil, false},
		{`["reg/app:*"]`, nil, false},
		{`{"patterns":"reg/app:*"}`, nil, false},
	} {
		l, err := DecodeKeep([]byte(tc.value))
		if (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok=%v", tc.value, err, tc.ok)
			continue
		}
		if tc.ok && !slices.Equal(l.Patterns, tc.want) {
			t.Errorf("%s: patterns %q, want %q", tc.value, l.Patterns, tc.want)
		}
	}
}
