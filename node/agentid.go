package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gcagent/gcagent/internal/clock"
)

// What the agent lock (agentlock.go) says of its holder, and how another
// agent of the same boot and pid namespace tells whether it runs.

// Agent lock label keys.
const (
	lockLabelNode     = "gcagent.io/node"
	lockLabelPid      = "gcagent.io/pid"
	lockLabelPidNS    = "gcagent.io/pid-namespace"
	lockLabelStart    = "gcagent.io/process-start"
	lockLabelStateDir = "gcagent.io/state-dir"
	lockLabelStateID  = "gcagent.io/state-id"
	lockLabelBootID   = "gcagent.io/boot-id"
	lockLabelVersion  = "gcagent.io/version"
	lockLabelSince    = "gcagent.io/since"
	lockLabelToken    = "gcagent.io/token"
)

// AgentID is what the agent lock says of the agent that holds it.
type AgentID struct {
	Node     string
	Pid      int
	StateDir string
	// StateID names the state dir itself (a random id kept in it): a
	// lock of the same StateID was taken by an earlier run of this state
	// dir, over, since the state dir's own lock is held now.
	StateID string
	// BootID, PidNS and Start (the process's start time in clock ticks
	// after boot) tell whether the process is alive, when it runs in the
	// same boot and pid namespace.
	BootID  string
	PidNS   string
	Start   uint64
	Version string
	Since   time.Time
}

// String names the agent in one phrase: node, pid, state dir.
func (a AgentID) String() string {
	s := fmt.Sprintf("node %s, pid %d", a.Node, a.Pid)
	if a.PidNS != "" && a.PidNS != selfPidNS() {
		s += " (in another pid namespace)"
	}
	s += ", state dir " + a.StateDir
	if !a.Since.IsZero() {
		s += ", since " + a.Since.UTC().Format(time.RFC3339)
	}
	if a.Version != "" {
		s += ", version " + a.Version
	}
	return s
}

func (a AgentID) labels(token string) map[string]string {
	return map[string]string{
		lockLabelNode: a.Node, lockLabelPid: strconv.Itoa(a.Pid), lockLabelPidNS: a.PidNS,
		lockLabelStart: strconv.FormatUint(a.Start, 10), lockLabelStateDir: a.StateDir, lockLabelStateID: a.StateID,
		lockLabelBootID: a.BootID, lockLabelVersion: a.Version, lockLabelSince: a.Since.UTC().Format(time.RFC3339Nano),
		lockLabelToken: token,
	}
}

func agentOf(labels map[string]string) AgentID {
	pid, _ := strconv.Atoi(labels[lockLabelPid])
	start, _ := strconv.ParseUint(labels[lockLabelStart], 10, 64)
	since, _ := time.Parse(time.RFC3339Nano, labels[lockLabelSince])
	return AgentID{Node: labels[lockLabelNode], Pid: pid, PidNS: labels[lockLabelPidNS], Start: start,
		StateDir: labels[lockLabelStateDir], StateID: labels[lockLabelStateID], BootID: labels[lockLabelBootID],
		Version: labels[lockLabelVersion], Since: since}
}

// ThisAgent is the identity of this process for the agent lock: node,
// state dir and state dir id as given, the rest read from the system.
func ThisAgent(node, stateDir, stateID, version string) AgentID {
	return AgentID{Node: node, Pid: os.Getpid(), StateDir: stateDir, StateID: stateID, BootID: clock.BootID(),
		PidNS: selfPidNS(), Start: processStart(os.Getpid()), Version: version, Since: time.Now().UTC()}
}

// selfPidNS names this process's pid namespace ("pid:[4026531836]").
func selfPidNS() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

// processStart is pid's start time in clock ticks after boot (field 22
// of /proc/<pid>/stat); 0 when it cannot be read.
func processStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	return statStart(b)
}

// statStart reads the start time from a /proc/<pid>/stat line.
func statStart(b []byte) uint64 {
	// The command (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64) // field 22 is the 20th after the command
	return v
}

// processAlive reports whether agent a's process (of this boot and pid
// namespace) runs: its pid is there with its start time. Not known when
// its /proc entry cannot be read, or when it is there and a recorded no
// start time (the pid may be another process's now).
func processAlive(a AgentID) (alive, known bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(a.Pid) + "/stat")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, true
	case err != nil || a.Start == 0:
		return false, false
	}
	start := statStart(b)
	return start == a.Start, start != 0
}
