package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIListingAt30000: the agent's CRI calls that list every container
// (an image delete's re-check of CRI's image ids; a listing's exited
// containers) work at 30,000 CRI containers, whose list is over the 16 MiB
// that gRPC clients, the kubelet's among them, accept by default. containerd
// sends at most 16 MiB unless [grpc] max_send_message_size is raised, as
// this daemon's is (README: Kubelet handover).
func TestCRIListingAt30000(t *testing.T) {
	const criContainers = 30_000
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "3g", MaxSendBytes: 64 << 20})
			// Containers 0, 2, 4, ... are CRI's, of images 0, 2, 4, 6, 8.
			seed := testenv.Seed{Images: 10, Containers: 2 * criContainers, CRIManaged: true}
			c.SeedRecords(t, seed)
			c.SeedCRIExited(t, seed, time.Now())
			c.Restart() // CRI loads what it finds at start

			conn, err := events.DialCRI(c.Address)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cri := runtime.NewRuntimeServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var all *runtime.ListContainersResponse
			for {
				all, err = cri.ListContainers(ctx, &runtime.ListContainersRequest{})
				if err == nil || !strings.Contains(err.Error(), "not initialized") || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("list CRI containers through the agent's connection: %v", err)
			}
			size := proto.Size(all)
			t.Logf("CRI lists %d containers in %.1f MiB", len(all.Containers), float64(size)/(1<<20))
			if len(all.Containers) != criContainers || size <= 16<<20 {
				t.Fatalf("CRI lists %d containers in %d bytes: want %d, over 16 MiB", len(all.Containers), size, criContainers)
			}

			// The re-check before an image delete: CRI's users by image id.
			var want []string
			config := ""
			for _, ct := range all.Containers {
				if ct.Image.GetImage() == seed.ImageName(0) {
					want, config = append(want, ct.Id), ct.ImageRef
				}
			}
			slices.Sort(want)
			rt := gc.Runtime{Client: c.Client, CRI: cri, Namespace: events.CRINamespace}
			users, err := rt.ImageUsers(ctx, nil, config, "")
			if err != nil {
				t.Fatalf("image users of %s: %v", config, err)
			}
			if len(want) != criContainers/5 || !slices.Equal(users, want) {
				t.Fatalf("image users of %s: %d, want the %d CRI containers of %s (%d)", config, len(users), len(want), seed.ImageName(0), criContainers/5)
			}

			// A listing: every CRI container exited and lost its task.
			l, err := events.NewSource(events.Options{Client: c.Client, CRI: cri, Log: zerolog.Nop()}).List(ctx, events.CRINamespace)
			if err != nil {
				t.Fatal(err)
			}
			stopped := 0
			for _, task := range l.Tasks {
				if task.Status == events.TaskStopped {
					stopped++
				}
			}
			if stopped != criContainers {
				t.Fatalf("listing: %d stopped CRI containers, want %d", stopped, criContainers)
			}
		})
	}
}
