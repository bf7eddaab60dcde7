package replay

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/gcagent/gcagent/gc"
)

// PullCost prices a re-pull in time: Fixed for every pull (resolving the
// reference, the registry's round trips, creating snapshots and names),
// plus the image's size over Throughput, except for an image a peer or a
// mirror close to the node holds (Near), which costs Fixed only.
//
// The trace cannot measure either: an image's arrival is recorded when
// containerd creates its record, after the content is fetched (and, on
// 2.x, unpacked), and a pull's start is recorded nowhere; the disk is
// sampled at steps of a percent. So they are given (DefaultPullCost).
type PullCost struct {
	Fixed time.Duration `json:"fixedNs"`
	// Throughput is in bytes per second of the image's size as the
	// kubelet counts it (what a pull fetches, compressed).
	Throughput int64 `json:"throughputBytesPerSecond"`
	// Near are what a peer or a mirror holds: a registry host glob
	// (path.Match on the domain of a name: mirror.internal:5000,
	// *.internal, docker.io), or, with a /, a keep pattern
	// (gc.KeepCovers: registry.example/team-1/*).
	Near []string `json:"near,omitempty"`
}

// DefaultPullCost is 1 s per pull plus 32 MiB/s, nothing near. Reasoned
// from public pulls (docs/replay.md#pull-time): a 31 MB image from
// registry.k8s.io in 1.07 s (the fixed part under a second), a 728 MB one
// in 28 to 75 s on a one-core cloud node (10 to 26 MB/s,
// containerd/containerd#2886).
func DefaultPullCost() PullCost {
	return PullCost{Fixed: time.Second, Throughput: 32 << 20}
}

// Validate reports a negative fixed cost, a throughput not positive, or
// a near pattern that is no well-formed glob.
func (c PullCost) Validate() error {
	switch {
	case c.Fixed < 0:
		return fmt.Errorf("invalid --pull-fixed-cost %s: must not be negative", c.Fixed)
	case c.Throughput <= 0:
		return fmt.Errorf("invalid --pull-throughput %d: must be positive (bytes per second, e.g. 32MiB)", c.Throughput)
	}
	for _, n := range c.Near {
		if _, err := path.Match(n, ""); err != nil || n == "" {
			return fmt.Errorf("invalid --pull-near %q: want a registry host glob or a keep pattern", n)
		}
	}
	return nil
}

func (c PullCost) orDefault() PullCost {
	if c.Fixed == 0 && c.Throughput == 0 {
		d := DefaultPullCost()
		d.Near = c.Near
		return d
	}
	return c
}

// Of is what pulling an image of that size with those names costs.
func (c PullCost) Of(names []string, size int64) time.Duration {
	if c.near(names) || c.Throughput <= 0 {
		return c.Fixed
	}
	return c.Fixed + time.Duration(float64(size)/float64(c.Throughput)*float64(time.Second))
}

// near reports whether a peer or a mirror holds an image with names.
func (c PullCost) near(names []string) bool {
	for _, pattern := range c.Near {
		for _, n := range names {
			if strings.Contains(pattern, "/") {
				if gc.KeepCovers(pattern, n) {
					return true
				}
				continue
			}
			if strings.HasPrefix(n, "sha256:") {
				continue // CRI's image id: no registry
			}
			ref, err := reference.ParseNormalizedNamed(n)
			if err != nil {
				continue
			}
			if ok, _ := path.Match(pattern, reference.Domain(ref)); ok {
				return true
			}
		}
	}
	return false
}

// String writes c for people: "1s + size / 32 MiB/s (near: fixed only)".
func (c PullCost) String() string {
	s := fmt.Sprintf("%s + size / %s/s", c.Fixed, gc.HumanBytes(c.Throughput))
	if len(c.Near) > 0 {
		s += fmt.Sprintf("; %s from a peer or mirror: %s", strings.Join(c.Near, ","), c.Fixed)
	}
	return s
}
