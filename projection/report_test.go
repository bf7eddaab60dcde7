package projection

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestReportOmitsNeverUsed: an image no container ever used has no
// lastUsed in JSON (not 0001-01-01T00:00:00Z); a used one has it.
func TestReportOmitsNeverUsed(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := New()
	s.Images["sha256:aa"] = &Image{Digest: "sha256:aa", Names: ImageNames{{Name: "never:1"}}, FirstSeen: StampOf(now)}
	s.Images["sha256:bb"] = &Image{Digest: "sha256:bb", Names: ImageNames{{Name: "used:1"}}, FirstSeen: StampOf(now), LastUsed: StampOf(now)}
	b, err := json.Marshal(NewReport(now, s))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Images []map[string]any `json:"images"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, img := range doc.Images {
		_, has := img["lastUsed"]
		if want := img["digest"] == "sha256:bb"; has != want {
			t.Errorf("image %v: lastUsed present %v, want %v", img["digest"], has, want)
		}
	}
	if strings.Contains(string(b), "0001-01-01") {
		t.Errorf("zero time in the report: %s", b)
	}
}
