package main

import (
	"context"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/version"
)

// TestVersionCommand: `gcagent version` names the version, the commit and
// the Go version, as stamped by -ldflags.
func TestVersionCommand(t *testing.T) {
	defer func(v, c string) { version.Version, version.Commit = v, c }(version.Version, version.Commit)
	version.Version, version.Commit = "v9.8.7", "0123abc"
	var out strings.Builder
	if err := dispatch(context.Background(), []string{"version"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "gcagent v9.8.7 commit 0123abc "+runtime.Version()+", with the embedded NATS server\n"; got != want {
		t.Errorf("version printed %q, want %q", got, want)
	}
}
