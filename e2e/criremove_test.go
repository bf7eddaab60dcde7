package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
)

// pullDuringRemove is CRI's image service with a pull that lands while
// RemoveImage runs: right after CRI removed the image, it makes names on
// the same target, as a pull does (containerd's synchronous GC inside the
// call makes that window wide on a real node).
type pullDuringRemove struct {
	runtime.ImageServiceClient
	during func(ctx context.Context)
}

func (p pullDuringRemove) RemoveImage(ctx context.Context, in *runtime.RemoveImageRequest, opts ...grpc.CallOption) (*runtime.RemoveImageResponse, error) {
	resp, err := p.ImageServiceClient.RemoveImage(ctx, in, opts...)
	if err == nil {
		p.during(ctx)
	}
	return resp, err
}

// TestCRIRemovalKeepsNamesMadeDuringIt: after CRI's RemoveImage the adapter
// deletes natively only the names the re-check saw. A name a pull made
// during the call (a new tag, and the very tag the re-check saw, made
// again) is kept, and the removal says the names changed.
func TestCRIRemovalKeepsNamesMadeDuringIt(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		const tag, newTag = "example.test/pulled:1", "example.test/pulled:2"
		rec := c.Import(t, testenv.Runnable(tag, testenv.Layer{Seed: "pulled-" + string(v), Size: 64 << 10}))[0]
		digest := rec.Target.Digest.String()
		cri, criImages := c.CRI(t)
		ctx := c.Ctx()
		is := c.Client.ImageService()

		made := func(ctx context.Context) {
			ctx = c.Ctx() // the call's own context is CRI's, not the namespace's
			labels := map[string]string{"io.cri-containerd.image": "managed"}
			if _, err := is.Create(ctx, images.Image{Name: newTag, Target: rec.Target, Labels: labels}); err != nil {
				t.Errorf("pull of %s during the removal: %v", newTag, err)
			}
			if _, err := is.Create(ctx, images.Image{Name: tag, Target: rec.Target, Labels: labels}); err != nil {
				t.Errorf("pull of %s during the removal: %v", tag, err)
			}
		}
		rt := node.NewRuntime(c.Client, cri, pullDuringRemove{criImages, made})

		// CRI adopts the imported image: its id becomes a second name and
		// both are labelled managed.
		var names []gc.ImageName
		testenv.Eventually(t, 30*time.Second, func() string {
			var err error
			if names, err = rt.ImageNames(ctx, events.CRINamespace, digest); err != nil {
				return err.Error()
			}
			managed := 0
			for _, n := range names {
				if n.Labels["io.cri-containerd.image"] == "managed" {
					managed++
				}
			}
			if len(names) != 2 || managed != 2 {
				return fmt.Sprintf("CRI has not adopted the image yet: %+v", names)
			}
			return ""
		})
		for _, n := range names {
			if n.Created.IsZero() {
				t.Fatalf("name %s has no creation time", n.Name)
			}
		}

		via, err := rt.RemoveImage(context.Background(), events.CRINamespace, digest, names)
		if via != "cri" {
			t.Fatalf("removed via %q (%v), want cri", via, err)
		}
		if !errors.Is(err, gc.ErrImageChanged) || !strings.Contains(err.Error(), newTag) {
			t.Errorf("removal error %v, want one wrapping %v that names %s", err, gc.ErrImageChanged, newTag)
		}
		left, lerr := rt.ImageNames(ctx, events.CRINamespace, digest)
		if lerr != nil {
			t.Fatal(lerr)
		}
		var now []string
		for _, n := range left {
			now = append(now, n.Name)
		}
		for _, want := range []string{tag, newTag} {
			if !slices.Contains(now, want) {
				t.Errorf("%s, made by a pull during the removal, was deleted; names left: %v", want, now)
			}
		}
	})
}
