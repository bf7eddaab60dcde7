package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/node"
)

// TestIntentSettlesByIdentity: a delete intent is settled by the identity
// it recorded (a container's creation time, an image's names with theirs)
// as containerd reports it, never by comparing the intent's wall-clock
// time with containerd's stamps: an intent recorded an hour "before" the
// object was made (the wall clock stepped back between them) does not
// report as removed an object that is still there. An intent without an
// identity (an earlier version's) fails closed: an object found is not
// gone. An object made again under the same key is another one: the
// recorded one is gone.
func TestIntentSettlesByIdentity(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v})
		const ns = "identity"
		ctx := namespaces.WithNamespace(context.Background(), ns)
		rt := node.NewRuntime(c.Client, nil, nil)
		gone := func(t *testing.T, what string, in deletion.Intent, want bool) {
			t.Helper()
			in.Namespace = ns
			got, err := rt.Gone(context.Background(), in)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got != want {
				t.Errorf("%s: gone %v, want %v", what, got, want)
			}
		}

		t.Run("container", func(t *testing.T) {
			const id = "identity-1"
			create := func() time.Time {
				t.Helper()
				ctr, err := c.Client.NewContainer(ctx, id, client.WithSpec(&specs.Spec{}), client.WithRuntime("io.containerd.runc.v2", nil))
				if err != nil {
					t.Fatal(err)
				}
				info, err := ctr.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return info.CreatedAt
			}
			remove := func() {
				t.Helper()
				if err := c.Client.ContainerService().Delete(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			created := create()
			stepped := created.Add(-time.Hour) // the intent's wall clock, an hour behind containerd's
			in := deletion.Intent{Kind: "container", Subject: id, At: stepped}
			gone(t, "there, no identity, intent an hour before its creation", in, false)
			in.Identity = &deletion.Identity{Created: created}
			gone(t, "there, its identity", in, false)

			remove()
			again := create()
			if again.Equal(created) {
				t.Fatalf("made again with the same creation time %v", again)
			}
			gone(t, "made again, the first one's identity", in, true)
			in.Identity = nil
			gone(t, "made again, no identity", in, false)

			remove()
			gone(t, "deleted, no identity", in, true)
			in.Identity = &deletion.Identity{Created: created}
			gone(t, "deleted, its identity", in, true)
		})

		t.Run("image", func(t *testing.T) {
			const name = "example.test/identity:1"
			target := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("identity " + string(v)), Size: 10}
			is := c.Client.ImageService()
			create := func() time.Time {
				t.Helper()
				img, err := is.Create(ctx, images.Image{Name: name, Target: target})
				if err != nil {
					t.Fatal(err)
				}
				return img.CreatedAt
			}
			remove := func() {
				t.Helper()
				if err := is.Delete(ctx, name); err != nil {
					t.Fatal(err)
				}
			}
			created := create()
			in := deletion.Intent{Kind: "image", Subject: target.Digest.String(), At: created.Add(-time.Hour)}
			gone(t, "there, no identity, intent an hour before its creation", in, false)
			in.Identity = &deletion.Identity{Names: []deletion.Name{{Name: name, Created: created}}}
			gone(t, "there, its identity", in, false)

			remove()
			if again := create(); again.Equal(created) {
				t.Fatalf("made again with the same creation time %v", again)
			}
			gone(t, "pulled again, the first one's identity", in, true)
			saved := in.Identity
			in.Identity = nil
			gone(t, "pulled again, no identity", in, false)

			remove()
			gone(t, "deleted, no identity", in, true)
			in.Identity = saved
			gone(t, "deleted, its identity", in, true)
		})
	})
}
