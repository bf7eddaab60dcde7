package agent

import (
	"os"
	"runtime"
)

// A started agent follows containerd one event at a time, each a few
// lookups and a journal write, and waits in between. With more processors
// than that work needs, the Go scheduler wakes another thread for each
// event and keeps it spinning for more work before it sleeps again
// (runtime.findRunnable, the scheduler's monitor and their sleeps were a
// third of the agent's CPU per event one at a time, in perf, at 10,000
// images and containers on two cores). oneProcessor gives the started agent
// one processor; its start (a busy node's listing is decoded while
// containerd serves the rest of it) keeps all. A GOMAXPROCS variable
// overrides both.

// oneProcessor sets GOMAXPROCS to 1 unless the environment sets it, and
// returns the value before and whether it changed it.
func oneProcessor() (before int, changed bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0), false
	}
	return runtime.GOMAXPROCS(1), true
}
