package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Pid returns the agent's process id.
func (a *Agent) Pid() int { return a.cmd.Process.Pid }

// Pid returns the daemon's process id (0 while it is stopped).
func (c *Containerd) Pid() int {
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// ProcMemory is a process's resident memory from /proc/<pid>/status.
type ProcMemory struct {
	RSS  int64 // VmRSS, bytes
	Peak int64 // VmHWM (peak RSS since start), bytes
	// Anon and File split RSS: the process's own memory, and pages of
	// mapped files (the binary, the state database) the kernel may drop.
	Anon, File int64
}

// ReadProcMemory reads VmRSS, VmHWM, RssAnon and RssFile of pid.
func ReadProcMemory(pid int) (ProcMemory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcMemory{}, err
	}
	var m ProcMemory
	fields := map[string]*int64{"VmRSS": &m.RSS, "VmHWM": &m.Peak, "RssAnon": &m.Anon, "RssFile": &m.File}
	for _, l := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(l, ":")
		dst := fields[key]
		if !ok || dst == nil {
			continue
		}
		f := strings.Fields(val) // "12345 kB"
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("/proc/%d/status: %q", pid, l)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc/%d/status: %q", pid, l)
		}
		*dst = kb << 10
	}
	return m, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// ReadProcCPU returns the CPU time pid has used so far, user plus system,
// over all its threads (utime + stime of /proc/<pid>/stat), at 10ms
// resolution.
func ReadProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields count from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state); utime is field 14, stime 15
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ReadProcSwitches returns how many times pid's threads have left the CPU
// so far (voluntary and not, over /proc/<pid>/task/*/status): each
// hand-off between goroutines that wakes a thread costs one or two.
func ReadProcSwitches(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		for _, l := range strings.Split(string(b), "\n") {
			key, val, ok := strings.Cut(l, ":")
			if !ok || (key != "voluntary_ctxt_switches" && key != "nonvoluntary_ctxt_switches") {
				continue
			}
			v, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/task/%s/status: %q", pid, t.Name(), l)
			}
			n += v
		}
	}
	return n, nil
}
