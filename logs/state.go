package logs

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gcagent/gcagent/projection"
)

// projectionState answers the cleaner's questions from the projection (the
// kubelet's semantics of its log dirs): the agent's Live one, or a state
// built once (for `gcagent plan`). It asks
// nothing of containerd or CRI: every answer is the projection's, kept up
// to date by containerd's events and relists, so a pass costs no call
// however many pod dirs it judges (PodState says why that is safe).
type projectionState struct {
	view       func(fn func(*projection.State))
	containerd func() string
}

var _ State = projectionState{}

// LiveState reads the live projection of CRI's namespace (the only one
// with kubelet logs) under its lock; containerd names the containerd it
// follows (node.Source.Containerd; nil: not known).
func LiveState(l interface{ View(func(*projection.State)) }, containerd func() string) State {
	return projectionState{view: l.View, containerd: containerd}
}

// StaticState reads s, which nothing else may modify meanwhile (for
// `gcagent plan`), listed from the containerd named containerd ("": not
// known).
func StaticState(s *projection.State, containerd string) State {
	return projectionState{view: func(fn func(*projection.State)) { fn(s) }, containerd: func() string { return containerd }}
}

// Containerd names the containerd the projection follows.
func (s projectionState) Containerd() string {
	if s.containerd == nil {
		return ""
	}
	return s.containerd()
}

// Synced reports whether the projection has listed containerd.
func (s projectionState) Synced() (synced bool) {
	s.view(func(st *projection.State) { synced = st.Synced })
	return synced
}

// ContainerState reports a container as running while it is not known to
// have exited (created or running), as the kubelet keeps the link of any
// container that is not exited. An id the projection does not hold exactly
// may be a truncated link name's prefix: it matches the containers it
// prefixes, running if any of them is.
func (s projectionState) ContainerState(id string) (running, known bool) {
	s.view(func(st *projection.State) {
		if c := st.Containers[id]; c != nil {
			running, known = c.State != projection.StateExited, true
			return
		}
		if len(id) < 6 || len(id) >= 64 {
			return
		}
		for cid, c := range st.Containers {
			if strings.HasPrefix(cid, id) {
				known = true
				running = running || c.State != projection.StateExited
			}
		}
	})
	return running, known
}

// CRIContainersRunning reports whether a CRI container (not a sandbox) runs.
func (s projectionState) CRIContainersRunning() (running bool) {
	s.view(func(st *projection.State) {
		for _, c := range st.Containers {
			if c.CRIKind == projection.KindContainer && c.State == projection.StateRunning {
				running = true
				return
			}
		}
	})
	return running
}

// SandboxLogDirs returns the log dirs CRI gave the pods whose sandbox
// exists, from the projection's pods (their sandboxes' spec annotation).
func (s projectionState) SandboxLogDirs() (dirs []string) {
	s.view(func(st *projection.State) {
		for _, p := range st.Pods {
			if p.Alive() && p.LogDir != "" {
				dirs = append(dirs, p.LogDir)
			}
		}
	})
	return dirs
}

// PodState reports whether a sandbox of uid exists and since when the last
// one is gone, from the projection's pods (remembered for --pod-log-grace
// and longer after they go).
//
// CRI is not asked: its sandboxes are containerd containers of CRI's
// namespace (io.cri-containerd.kind=sandbox, made by its podsandbox
// controller, the only one gcagent supports), and this is the projection
// of that namespace, which holds every container there once synced
// (subscribe, then list, relist after every reconnect) and places each
// sandbox in its pod by the kubelet's uid label or, failing that, CRI's
// sandbox-uid annotation: it sees every sandbox CRI's uid label selector
// did. Nothing is judged before the projection is synced; a pod dir the
// kubelet made before its sandbox existed is a uid the projection does not
// know, kept for the grace from when the dir was first seen. Asking CRI
// per dir cost a call per dead pod dir per pass for ever (a dir kept as a
// mount point) and stalled a pass for 5 s per dir while CRI hung.
func (s projectionState) PodState(uid string) (alive bool, goneSince time.Time, known bool) {
	s.view(func(st *projection.State) {
		if p := st.Pods[uid]; p != nil {
			alive, known = p.Alive(), true
			if !alive {
				goneSince = p.GoneAt
			}
		}
	})
	return alive, goneSince, known
}

// PodLogDirExists says a pod is still there while the kubelet keeps its log
// dir (<pod-log-dir>/<namespace>_<name>_<uid>): it removes that dir only
// for pods that are gone.
func PodLogDirExists(podLogDir string) func(uid, namespace, name string) bool {
	return func(uid, namespace, name string) bool {
		if uid == "" || namespace == "" || name == "" || strings.ContainsRune(namespace+name+uid, '/') {
			return false
		}
		st, err := os.Lstat(filepath.Join(podLogDir, namespace+"_"+name+"_"+uid))
		return err == nil && st.IsDir()
	}
}
