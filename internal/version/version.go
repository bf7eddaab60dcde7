// Package version holds what `make build` and `make image` stamp into the
// binary (-ldflags "-X github.com/gcagent/gcagent/internal/version.Version=..."),
// so that an operator can tell which build a node runs.
package version

var (
	// Version is the release (the VERSION file), "dev" when not stamped.
	Version = "dev"
	// Commit is the full commit hash (with -dirty for a changed tree), "unknown" when not stamped.
	Commit = "unknown"
)
