// Package crilist is the end-to-end test of CRI listings at a busy node's
// size: a package of its own, so that go test starts it beside the e2e
// package's first phase instead of after it (it is the longest end-to-end
// test, and CPU-bound; its daemons run niced). See docs/testing.md.
package crilist

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIListingAt30000: the agent's CRI calls that list every container
// (an image delete's re-check of CRI's image ids; a listing's exited
// containers) work past the daemon's send limit. The re-check asks one
// state at a time: shown with containerd's limit lowered to 8 MiB, under
// 12,000 containers in two states (9-10 MiB in one list), as containerd 1.6
// cannot load 30,000 in two (it blocks a thread on each created container's
// output FIFO, and dies past 10,000). Then 30,000 exited ones on
// containerd's default limit
// (16 MiB; their list is 22-24 MiB): a listing asks each container without
// a task, and the re-check, whose one state is over the limit, fails (the
// image is kept) with an error that names containerd's setting.
func TestCRIListingAt30000(t *testing.T) {
	t.Parallel()
	const criContainers, loaded = 30_000, 12_000
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "3g", MaxSendBytes: 8 << 20, Nice: 10})
			// Containers 0, 2, 4, ... are CRI's, of images 0, 2, 4, 6, 8. CRI
			// loads the first 12,000: 3 in 4 exited (9,000), the others created
			// and never started (3,000).
			seed := testenv.Seed{Images: 10, Containers: 2 * criContainers, CRIManaged: true, Terminal: true}
			c.SeedRecords(t, seed)
			c.SeedCRIStatus(t, seed, time.Now(), func(i int) testenv.CRIStatus {
				switch {
				case i >= 2*loaded:
					return testenv.CRINotLoaded
				case i/2%4 == 3:
					return testenv.CRICreated
				}
				return testenv.CRIExited
			})
			c.Restart() // CRI loads what it finds at start

			conn, err := node.DialCRI(c.Address)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cri := runtime.NewRuntimeServiceClient(conn)
			// A bound on a failure only: CRI loads 12,000 and then 30,000
			// containers at nice 10, which took over 5 minutes beside
			// go build -a and a soak.
			ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
			defer cancel()
			overLimit := func(what string, want int) {
				t.Helper()
				for {
					_, err = cri.ListContainers(ctx, &runtime.ListContainersRequest{})
					if err == nil || !strings.Contains(err.Error(), "not initialized") || ctx.Err() != nil {
						break
					}
					time.Sleep(200 * time.Millisecond) // CRI not initialized yet after a restart: ask again
				}
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("one list of %d CRI containers: %v, want ResourceExhausted (over the %s)", want, err, what)
				}
				t.Logf("one list of %d CRI containers: %v", want, err)
			}
			overLimit("8 MiB set", loaded)

			// The re-check before an image delete: CRI's users by image id,
			// the loaded CRI containers of image 0 (i%10 == 0).
			st, err := cri.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: seed.ContainerID(0)})
			if err != nil {
				t.Fatal(err)
			}
			config := st.Status.ImageRef
			var want []string
			for i := 0; i < 2*loaded; i += 10 {
				want = append(want, seed.ContainerID(i))
			}
			slices.Sort(want)
			rt := node.NewRuntime(c.Client, cri, nil)
			holders, err := rt.ImageHolders(ctx, events.CRINamespace, gc.ImageRef{Config: config})
			if err != nil {
				t.Fatalf("image users of %s: %v", config, err)
			}
			var users []string
			for _, h := range holders {
				if h.Kind == gc.HolderCRI {
					users = append(users, h.ID)
				}
			}
			if !slices.Equal(users, want) {
				t.Fatalf("image users of %s: %d, want the %d loaded CRI containers of %s", config, len(users), len(want), seed.ImageName(0))
			}

			// A listing: the exited ones lost their task and are stopped, the
			// created ones are not.
			source := node.NewSource(node.Options{Client: c.Client, CRI: cri, Log: zerolog.Nop()})
			if n := stoppedIn(t, ctx, source); n != loaded*3/4 {
				t.Fatalf("listing: %d stopped CRI containers, want %d", n, loaded*3/4)
			}

			// All 30,000 exited, on containerd's default limit: the exited
			// ones alone are over it.
			c.SeedCRIExited(t, seed, time.Now())
			c.RestartWithSendLimit(0)
			overLimit("default 16 MiB", criContainers)
			if n := stoppedIn(t, ctx, source); n != criContainers {
				t.Fatalf("listing, all exited: %d stopped CRI containers, want %d", n, criContainers)
			}
			holders, err = rt.ImageHolders(ctx, events.CRINamespace, gc.ImageRef{Config: config})
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_send_message_size") {
				t.Fatalf("image users with 30,000 exited: %d users, err %v; want ResourceExhausted naming max_send_message_size", len(holders), err)
			}
		})
	}
}

// stoppedIn lists the CRI namespace through source and counts the stopped
// tasks, once CRI has loaded its containers.
func stoppedIn(t *testing.T, ctx context.Context, source *node.Source) int {
	t.Helper()
	for {
		l, err := source.List(ctx, events.CRINamespace)
		if err != nil {
			t.Fatal(err)
		}
		stopped := 0
		for _, task := range l.Tasks {
			if task.Status == events.TaskStopped {
				stopped++
			}
		}
		if stopped > 0 || ctx.Err() != nil {
			return stopped
		}
		time.Sleep(200 * time.Millisecond) // CRI not initialized yet after a restart
	}
}
