package main

import (
	"context"
	"runtime"
	"testing"

	"github.com/gcagent/gcagent/internal/version"
)

// TestVersionCommand: `gcagent version` names the version, the commit and
// the Go version, as stamped by -ldflags.
func TestVersionCommand(t *testing.T) {
	defer func(v, c string) { version.Version, version.Commit = v, c }(version.Version, version.Commit)
	version.Version, version.Commit = "v9.8.7", "0123abc"
	want := "gcagent v9.8.7 commit 0123abc " + runtime.Version() + ", with the embedded NATS server\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		out, _, err := runCLI(context.Background(), nil, args...)
		if err != nil || out != want {
			t.Errorf("%v printed %q (%v), want %q", args, out, err, want)
		}
	}
}
