package natsbus

import (
	"fmt"
	"strconv"
	"strings"
)

// MinServerVersion is the oldest NATS server gcagent supports: Debian 12's
// nats-server (apt-get install nats-server), which the tests run against
// beside the Go module's server. Every feature the agent uses (JetStream
// streams with per-subject limits and direct get, key-value watches with
// one filter subject each) works from there on.
const MinServerVersion = "2.9.10"

// ServerTooOld is the error of a feature the connected server is too old
// for.
type ServerTooOld struct {
	Feature string // what needs the newer server
	Version string // the server's
	Need    string // the oldest that has it
}

func (e *ServerTooOld) Error() string {
	return fmt.Sprintf("NATS server %s is too old for %s: it needs %s or later", e.Version, e.Feature, e.Need)
}

// CheckServerVersion returns a *ServerTooOld when version (a server's,
// as nats.Conn.ConnectedServerVersion says it) is older than
// MinServerVersion; nil for a newer one, and for an empty or unreadable
// version (not connected: nothing to judge).
func CheckServerVersion(version, feature string) error {
	have, ok := parseVersion(version)
	need, _ := parseVersion(MinServerVersion)
	if !ok {
		return nil
	}
	for i := range have {
		if have[i] != need[i] {
			if have[i] < need[i] {
				return &ServerTooOld{Feature: feature, Version: version, Need: MinServerVersion}
			}
			return nil
		}
	}
	return nil
}

// parseVersion reads major.minor.patch from "2.9.10", "v2.10.0-beta.1".
func parseVersion(v string) (out [3]int, ok bool) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+ "); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}
