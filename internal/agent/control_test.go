package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/projection"
)

// TestFindImageByShortName: explain finds an image by the names keep
// patterns match: as stored, in short form either way, or by digest.
func TestFindImageByShortName(t *testing.T) {
	s := projection.New()
	app4 := "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	other := "sha256:4444444444449999999999999999999999999999999999999999999999999999"
	s.Images[app4] = &projection.Image{Digest: app4, Names: projection.ImageNames{{Name: "docker.io/library/app4:v1"}}}
	s.Images[other] = &projection.Image{Digest: other, Names: projection.ImageNames{{Name: "registry.test/app4:v1"}}}
	for _, tc := range []struct{ query, want, wantErr string }{
		{query: "docker.io/library/app4:v1", want: app4},
		{query: "app4:v1", want: app4},
		{query: "library/app4:v1", want: app4},
		{query: "registry.test/app4:v1", want: other},
		{query: app4, want: app4},
		{query: "sha256:4444444444449", want: other},
		{query: "444444444444", wantErr: "ambiguous"},
		{query: "app5:v1", wantErr: "not known to this node"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			got, err := findImage(s, tc.query)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("findImage(%q) = %q, %v; want an error with %q", tc.query, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findImage(%q) = %q, %v; want %q", tc.query, got, err, tc.want)
			}
		})
	}
	if _, err := findImage(s, "nope:1"); !errors.Is(err, errImageUnknown) {
		t.Errorf("unknown image: %v, want errImageUnknown", err)
	}
}
