package projection

import (
	"fmt"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
)

// TestChurnLeavesNothingBehind: what comes and goes under load (images
// imported then collected, plain containers and pods run and removed)
// leaves nothing in the state, its indexes or its tracer once it is gone
// and its windows (regret, pod memory) ended: an agent's memory under a
// steady churn depends on what is on the node, not on how much went
// through it. The churn is `make soak`'s, one cycle a second.
func TestChurnLeavesNothingBehind(t *testing.T) {
	s := New()
	tr := newTracer(s)
	apply := func(evs ...events.Event) {
		for _, ev := range evs {
			s.Apply(ev)
			tr.observe(s, ev)
		}
	}
	const run, runDigest = "soak.test/run:1", "sha256:run"
	apply(events.ImageUpserted{At: at(0), Name: run, Digest: runDigest, Size: 1 << 20, ConfigDigest: "sha256:runcfg", ChainID: "sha256:runchain"},
		events.Synced{At: at(0)})
	type sizes struct{ images, names, containers, pods, deletions, deletedNames, users, byKey, dead, marks int }
	size := func() sizes {
		return sizes{len(s.Images), len(s.Names), len(s.Containers), len(s.Pods), len(s.Deletions), len(s.deletedNames),
			s.users.len(), s.byKey.len(), len(s.dead), len(tr.marks)}
	}
	before := size()

	const cycles = 5 * internFloor
	for i := range cycles {
		sec := 1 + i
		name, dg := fmt.Sprintf("soak.test/img-%06d:1", i), fmt.Sprintf("sha256:img%06d", i)
		ctr, sb, uid := fmt.Sprintf("soak-c-%06d", i), fmt.Sprintf("soak-sb-%06d", i), fmt.Sprintf("uid-%06d", i)
		apply(events.ImageUpserted{At: at(sec), Name: name, Digest: dg, Size: 4 << 20,
			ConfigDigest: "sha256:cfg" + dg[7:], ChainID: "sha256:chain" + dg[7:]},
			// a plain container of the kept image: created, run, exited, removed
			events.ContainerUpserted{At: at(sec), ID: ctr, Image: run, ImageDigest: runDigest, ImageID: "sha256:runcfg", RootChain: "sha256:runchain"},
			events.TaskStarted{At: at(sec), ContainerID: ctr, Pid: 1},
			events.TaskExited{At: at(sec), ContainerID: ctr, Pid: 1, ExitedAt: at(sec)},
			// a pod's sandbox and container of the new image
			events.ContainerUpserted{At: at(sec), ID: sb, Image: run, ImageDigest: runDigest, CRIKind: KindSandbox,
				PodUID: uid, PodName: "p" + uid, PodNamespace: "ns" + uid},
			events.ContainerUpserted{At: at(sec), ID: ctr + "-app", Image: name, ImageDigest: dg, CRIKind: KindContainer,
				PodUID: uid, PodName: "p" + uid, PodNamespace: "ns" + uid, ContainerName: "app", SandboxID: sb},
			events.ContainerDeleted{At: at(sec), ID: ctr + "-app"},
			events.ContainerDeleted{At: at(sec), ID: sb},
			events.ContainerDeleted{At: at(sec), ID: ctr},
			// image GC collects the image
			events.ImageCollected{At: at(sec), Digest: dg, Names: []string{name}, Size: 4 << 20, Rule: "space", Trigger: "disk",
				RegretUntil: at(sec).Add(24 * time.Hour)},
			events.ImageDeleted{At: at(sec), Name: name})
	}
	if n := len(s.Deletions); n != cycles {
		t.Fatalf("%d deletions held within their regret window, want %d", n, cycles)
	}
	end := at(cycles).Add(24*time.Hour + time.Second)
	s.ForgetDeletionsBefore(end)
	s.ForgetPodsGoneBefore(end)
	if after := size(); after != before {
		t.Errorf("after %d cycles, all gone and their windows ended, the state holds %+v, before them %+v", cycles, after, before)
	}
	if n := len(s.strs.m); n > internFloor {
		t.Errorf("the interner holds %d strings after %d cycles, over its floor %d", n, cycles, internFloor)
	}
	if len(s.touched) != 0 {
		t.Errorf("%d touched digests left after the tracer read them", len(s.touched))
	}
}
