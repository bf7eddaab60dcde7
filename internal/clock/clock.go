// Package clock is the agent's one clock: the wall time read once at start,
// advanced by the host's uptime (CLOCK_BOOTTIME, monotonic), so that a step
// of the wall clock while the agent runs (NTP, an operator, a VM resume)
// moves no age and fires no timer early; and, within one boot, continued
// across agent restarts (Continue, Save) so that a step while the agent is
// down does not either.
package clock

import (
	"encoding/json"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Clock reads the time the agent plans with. The zero value is not usable;
// New returns one. Safe for concurrent use.
//
// Now is the wall time at start plus the uptime elapsed since, so it never
// jumps: after a wall-clock step it differs from the host's wall clock by
// that step until the host reboots (an agent restart continues it). Ages are
// differences of Now and times recorded from containerd's events, which the
// events package bounds by the agent's time of receipt, so they stay true
// across a step in either direction.
type Clock struct {
	base   time.Time     // the agent's time at boot0, no monotonic reading
	boot0  time.Duration // uptime (CLOCK_BOOTTIME) at base
	bootID string        // the kernel boot the uptime belongs to
	skew   *Skew
}

// New returns a clock anchored at the current wall time as skew sees it
// (nil: the host's wall clock).
func New(skew *Skew) *Clock {
	return &Clock{base: wall(skew), boot0: uptime(), bootID: bootID(), skew: skew}
}

// wall is the host's wall clock as skew sees it.
func wall(skew *Skew) time.Time { return time.Now().Add(skew.Get()).Round(0).UTC() }

// processStart backs uptime where CLOCK_BOOTTIME cannot be read.
var processStart = time.Now()

// uptime is CLOCK_BOOTTIME: monotonic (no wall-clock step moves it) and,
// unlike Go's monotonic clock, it counts time the host spent suspended, so
// things age across a suspend as they do on the wall clock.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Since(processStart)
	}
	return time.Duration(ts.Nano())
}

// BootID names the running kernel boot ("" if unknown): the same in every
// container of the host, another after a reboot.
func BootID() string { return bootID() }

// bootID names the running kernel boot ("" if unknown): uptimes compare
// only within one boot.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// File is the name of the clock's mark in the state dir.
const File = "clock.json"

// mark is what Save records: the agent's time at an uptime of one boot.
type mark struct {
	BootID string        `json:"bootID"`
	Uptime time.Duration `json:"uptime"`
	Time   time.Time     `json:"time"`
}

// maxDrift is how far the wall clock may be from the time a saved mark
// predicts before Continue calls it a step: the wall clock and uptime are
// both disciplined by NTP and agree far closer than this.
const maxDrift = 2 * time.Second

// Continue returns a clock that goes on from the mark a previous agent of
// this boot saved at path (Save), so that a wall-clock step while the agent
// was down moves no age either: the agent's time is that mark plus the
// uptime elapsed since. It also returns the step it absorbed (the wall
// clock minus the agent's time; zero when within maxDrift). Without a
// usable mark of this boot (first start, after a reboot, unreadable file)
// it is New: across a reboot a step cannot be told from downtime. It
// trusts that uptime is the same clock for every agent of a boot, which
// holds unless agents run in different time namespaces with different
// boot-time offsets.
func Continue(skew *Skew, path string) (c *Clock, step time.Duration) {
	c = New(skew)
	b, err := os.ReadFile(path)
	if err != nil {
		return c, 0
	}
	var m mark
	if json.Unmarshal(b, &m) != nil || m.BootID == "" || m.BootID != c.bootID || m.Time.IsZero() || m.Uptime > c.boot0 {
		return c, 0
	}
	expected := m.Time.Add(c.boot0 - m.Uptime).Round(0).UTC()
	if d := c.base.Sub(expected); d > maxDrift || d < -maxDrift {
		c.base, step = expected, d
	}
	return c, step
}

// Save records the agent's time and the uptime at path (atomically, 0600)
// for Continue. Call it now and then and at shutdown; a failed Save costs
// only the continuity of the next start.
func (c *Clock) Save(path string) error {
	up := uptime()
	b, err := json.Marshal(mark{BootID: c.bootID, Uptime: up, Time: c.base.Add(up - c.boot0)})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Now returns the agent's time (UTC, without a monotonic reading, so that it
// compares with recorded times by their wall values). A nil Clock reads the
// host's wall clock.
func (c *Clock) Now() time.Time {
	if c == nil {
		return time.Now().Round(0).UTC()
	}
	return c.base.Add(uptime() - c.boot0)
}
