package logs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// These tests use only what the Cleaner had before the evidence was bound
// to its containerd (New, Clean, poddirs.json, the fake state), plus the
// fake's Containerd, which the old code never calls: they run against the
// old code too, and fail there.

// TestSavedEvidenceIsOfItsContainerd (review of issue 40, finding 1): what
// poddirs.json keeps of the pod log dir (cri: it holds the watched
// containerd's pods) was shown for one containerd. The agent restarted on
// another one with the same state dir and log dirs (a --containerd-address
// changed to Docker's containerd on a k3s node, a containerd reinstalled
// with its root wiped) has no pod there: the saved verdict says nothing of
// it, and the first containerd's live pods' dirs, one quiet for an hour,
// must stay (pod-log-dir-unverified), as must the link of its running
// container, dangling while its log rotates. Before the fix the saved
// verdict held for any containerd: the quiet dir went at once
// (pod-unknown) and the link a grace later (container-unknown).
func TestSavedEvidenceIsOfItsContainerd(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	file := filepath.Join(t.TempDir(), PodDirsFile)
	lt.st.containerd = "k3s-uuid"
	lt.pod(t, "ns_live_u9", cid("a1"))
	link, log := lt.pod(t, "ns_quiet_u2", cid("a2"))
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_live_u9"), filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2"))
	lt.st.setPod("u9", fakePod{alive: true})
	lt.st.setPod("u2", fakePod{alive: true})
	lt.st.setContainer(cid("a1"), true)
	lt.st.setContainer(cid("a2"), true)
	lt.start(t, file)
	if got := lt.pass(t); len(got) == 0 || lt.c.Status().PodLogDir.By != VerifiedByCRI {
		t.Fatalf("first containerd: pod log dir %+v, want cri", lt.c.Status().PodLogDir)
	}

	// Restarted on another containerd, which runs no pod.
	lt.st = newFakeState()
	lt.st.containerd = "docker-uuid"
	lt.now = lt.now.Add(time.Hour)
	if err := os.Remove(log); err != nil { // rotating: the link dangles for a moment
		t.Fatal(err)
	}
	backdate(t, time.Hour, filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2"))
	lt.start(t, file)
	for range 3 {
		got := lt.pass(t)
		for _, name := range []string{"ns_live_u9", "ns_quiet_u2"} {
			if !exists(filepath.Join(lt.cfg.PodLogDir, name)) {
				t.Fatalf("%s removed by an agent on another containerd (%s %s): the saved verdict was the first containerd's",
					name, got[name].Reason, got[name].Detail)
			}
			if d := got[name]; d.Reason != ReasonUnverified {
				t.Errorf("%s: %s %s, want %s", name, d.Action, d.Reason, ReasonUnverified)
			}
		}
		if !exists(link) {
			t.Fatalf("the link of the first containerd's running container removed (%s)", got[filepath.Base(link)].Reason)
		}
		lt.now = lt.now.Add(2 * time.Minute)
	}
	// Its live link shows the kubelet writes there, not that its pods are
	// this containerd's.
	if ev := lt.c.Status().PodLogDir; ev.By != VerifiedByLinks {
		t.Errorf("pod log dir %+v on a containerd that runs no pod there, want links", ev)
	}
}

// TestEvidenceNotSavedBeforeSync (review of issue 40, finding 1): before
// the projection has listed containerd, its pods are the ones the journal
// restored, which may be another containerd's (the agent restarted on
// another --containerd-address): what they show is no verdict to keep for
// the containerd now watched. Before the fix the first pass, unsynced,
// saved cri from the restored pods, and once synced (no pod) the agent
// removed the quiet dir of the other containerd's live pod.
func TestEvidenceNotSavedBeforeSync(t *testing.T) {
	lt := newLogTree(t, time.Minute)
	file := filepath.Join(t.TempDir(), PodDirsFile)
	lt.pod(t, "ns_quiet_u2", cid("a2"))
	backdate(t, time.Hour, filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2"))
	// The restored projection, not synced yet: the pod of the containerd
	// the agent watched before.
	lt.st.containerd = "docker-uuid"
	lt.st.synced = false
	lt.st.setLogDirs(filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2"))
	lt.st.setPod("u2", fakePod{alive: true})
	lt.start(t, file)
	lt.pass(t)
	// Synced: this containerd has no pod.
	lt.st.mu.Lock()
	lt.st.synced, lt.st.logDirs, lt.st.pods = true, nil, map[string]fakePod{}
	lt.st.mu.Unlock()
	lt.now = lt.now.Add(2 * time.Minute)
	got := lt.pass(t)
	if !exists(filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2")) {
		t.Fatalf("a pod dir removed on the verdict of pods restored from the journal (%s)", got["ns_quiet_u2"].Reason)
	}
	lt.start(t, file) // and after a restart
	lt.now = lt.now.Add(2 * time.Minute)
	got = lt.pass(t)
	if !exists(filepath.Join(lt.cfg.PodLogDir, "ns_quiet_u2")) {
		t.Fatalf("after a restart, a pod dir removed on a verdict saved before the sync (%s)", got["ns_quiet_u2"].Reason)
	}
}
