package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/filters"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// chainOf is a chain id made from a name, for readable fixtures.
func chainOf(name string) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(name)))
}

// fakeView is a snapshotter's parents and the image tops on it, as
// rootChain reads them; it counts the questions.
type fakeView struct {
	parents   map[string]string
	tops      map[string]bool
	parentErr map[string]error
	topErr    map[string]error
	asked     int
}

func (v *fakeView) ancestry() ancestry {
	return ancestry{
		parent: func(_ context.Context, sn, name string) (string, error) {
			if sn != "overlayfs" {
				return "", fmt.Errorf("asked snapshotter %s", sn)
			}
			v.asked++
			return v.parents[name], v.parentErr[name]
		},
		top: func(_ context.Context, sn, chain string) (bool, error) {
			if sn != "overlayfs" {
				return false, fmt.Errorf("asked snapshotter %s", sn)
			}
			v.asked++
			return v.tops[chain], v.topErr[chain]
		},
	}
}

func TestRootChain(t *testing.T) {
	a, b := chainOf("image-a"), chainOf("image-b") // b is derived from a: its chain's parent is a's top
	layer := chainOf("a-lower-layer")
	remap16 := a + "-100000-100000" // containerd 1.6's name of a remapped copy
	remap2 := chainOf("remapped-a") // 2.x names it by a digest
	remapB := chainOf("remapped-b") // a remapped copy of b
	deep := map[string]string{"rootfs": "l1"}
	for i := 1; i < 40; i++ {
		deep[fmt.Sprintf("l%d", i)] = fmt.Sprintf("l%d", i+1)
	}
	deepTop := func(at int) map[string]bool { return map[string]bool{fmt.Sprintf("l%d", at): true} }
	boom := errors.New("containerd says no")
	for _, tc := range []struct {
		name      string
		parents   map[string]string
		tops      map[string]bool
		parentErr map[string]error
		topErr    map[string]error
		want      string
		wantErr   bool
	}{
		{name: "direct parent is a top", parents: map[string]string{"rootfs": a, a: layer}, tops: map[string]bool{a: true}, want: a},
		{name: "remapped, 1.6 name", parents: map[string]string{"rootfs": remap16, remap16: a, a: layer}, tops: map[string]bool{a: true}, want: a},
		{name: "remapped, 2.x digest", parents: map[string]string{"rootfs": remap2, remap2: a, a: layer}, tops: map[string]bool{a: true}, want: a},
		{name: "two intermediates", parents: map[string]string{"rootfs": "x", "x": remap2, remap2: a}, tops: map[string]bool{a: true}, want: a},
		{name: "derived image stops at its own top", parents: map[string]string{"rootfs": b, b: a, a: layer},
			tops: map[string]bool{a: true, b: true}, want: b},
		{name: "remapped derived image stops at the nearest top", parents: map[string]string{"rootfs": remapB, remapB: b, b: a},
			tops: map[string]bool{a: true, b: true}, want: b},
		{name: "image deleted: the next top up", parents: map[string]string{"rootfs": b, b: a}, tops: map[string]bool{a: true}, want: a},
		{name: "no top: the direct parent", parents: map[string]string{"rootfs": remap2, remap2: a, a: layer}, want: remap2},
		{name: "no parent", parents: map[string]string{}, want: ""},
		{name: "cycle", parents: map[string]string{"rootfs": "x", "x": "y", "y": "x"}, want: "x"},
		{name: "self parent", parents: map[string]string{"rootfs": "x", "x": "x"}, want: "x"},
		{name: "top at the bound", parents: deep, tops: deepTop(maxAncestry), want: fmt.Sprintf("l%d", maxAncestry)},
		{name: "top past the bound", parents: deep, tops: deepTop(maxAncestry + 1), want: "l1"},
		{name: "rootfs stat fails", parents: map[string]string{"rootfs": a}, parentErr: map[string]error{"rootfs": boom}, wantErr: true},
		{name: "ancestor stat fails", parents: map[string]string{"rootfs": remap2, remap2: a}, parentErr: map[string]error{remap2: boom},
			want: remap2, wantErr: true},
		{name: "top check fails", parents: map[string]string{"rootfs": remap2, remap2: a}, topErr: map[string]error{remap2: boom},
			want: remap2, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &fakeView{parents: tc.parents, tops: tc.tops, parentErr: tc.parentErr, topErr: tc.topErr}
			got, err := v.ancestry().rootChain(context.Background(), "overlayfs", "rootfs")
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("rootChain = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
			if max := 2*maxAncestry + 1; v.asked > max {
				t.Fatalf("asked %d questions, more than %d", v.asked, max)
			}
		})
	}
}

// fakeContent serves Walk from infos, applying the filters as containerd's
// content store does; it counts the walks.
type fakeContent struct {
	content.Store
	infos   []content.Info
	err     error
	walks   int
	filters []string
}

func (f *fakeContent) Walk(_ context.Context, fn content.WalkFunc, fs ...string) error {
	f.walks++
	f.filters = fs
	if f.err != nil {
		return f.err
	}
	filter, err := filters.ParseAll(fs...)
	if err != nil {
		return fmt.Errorf("filters %q: %w", fs, err)
	}
	for _, info := range f.infos {
		if filter.Match(content.AdaptInfo(info)) {
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestImageTop(t *testing.T) {
	a, b := chainOf("image-a"), chainOf("image-b")
	cs := &fakeContent{infos: []content.Info{
		{Digest: "sha256:aa", Labels: map[string]string{labelSnapshotRef + "overlayfs": a, labelSnapshotRef + "native": a}},
		{Digest: "sha256:bb", Labels: map[string]string{labelSnapshotRef + "native": b, "other": "x"}},
		{Digest: "sha256:cc"},
	}}
	tops := newImageTops(cs)
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	ask := func(ctx context.Context, sn, chain string, want bool, walks int) {
		t.Helper()
		got, err := tops.imageTop(ctx, sn, chain)
		if err != nil || got != want {
			t.Fatalf("imageTop(%s, %s) = %v, %v; want %v", sn, chain, got, err, want)
		}
		if cs.walks != walks {
			t.Fatalf("imageTop(%s, %s): %d content walks so far, want %d", sn, chain, cs.walks, walks)
		}
	}
	ask(ctx, "overlayfs", a, true, 1)
	if want := `labels."containerd.io/gc.ref.snapshot.overlayfs"==` + `"` + a + `"`; len(cs.filters) != 1 || cs.filters[0] != want {
		t.Fatalf("filters %q, want %q", cs.filters, want)
	}
	ask(ctx, "overlayfs", a, true, 1)                                                       // remembered
	ask(ctx, "overlayfs", b, false, 2)                                                      // b is unpacked on native only
	ask(ctx, "overlayfs", b, false, 3)                                                      // a no is asked again
	ask(ctx, "native", b, true, 4)                                                          // another snapshotter
	ask(ctx, "stargz", a, false, 5)                                                         // never unpacked there
	ask(namespaces.WithNamespace(context.Background(), "default"), "overlayfs", a, true, 6) // another namespace's content

	cs.err = errors.New("unavailable")
	if got, err := tops.imageTop(ctx, "overlayfs", b); got || err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("imageTop on a failing store = %v, %v; want false and its error", got, err)
	}
	ask(ctx, "overlayfs", a, true, 7) // still remembered: no walk
	cs.err = nil

	// The memory is bounded: past maxKnownTops it starts again.
	for i := range maxKnownTops {
		tops.known[topKey{"k8s.io", "overlayfs", fmt.Sprint(i)}] = struct{}{}
	}
	ask(ctx, "native", a, true, 8)
	if n := len(tops.known); n != 1 {
		t.Fatalf("%d tops remembered after the bound, want 1", n)
	}
}

// TestListingAncestry: a listing answers from its index, the listing's
// image chains first, the content labels only for the rest, listed once.
func TestListingAncestry(t *testing.T) {
	a, b := chainOf("image-a"), chainOf("image-b")
	remap := chainOf("remapped-a")
	ix := snapshotIndex{parents: map[snapshotRef]string{
		{"overlayfs", "c-plain"}: b, {"overlayfs", b}: a,
		{"overlayfs", "c-remap"}: remap, {"overlayfs", remap}: a,
		{"native", "c-native"}: remap, {"native", remap}: a,
	}}
	facts := map[string]ImageFacts{"sha256:tb": {Chain: b}}
	cix := &contentIndex{blobs: map[string]blobInfo{"sha256:ca": {labels: gcLabels{{labelSnapshotRef + "overlayfs", a}}}}}
	listed := 0
	anc := listingAncestry(ix, facts, nil, func(context.Context) *contentIndex { listed++; return cix })
	root := func(sn, key string) string {
		t.Helper()
		got, err := anc.rootChain(context.Background(), sn, key)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := root("overlayfs", "c-plain"); got != b || listed != 0 {
		t.Fatalf("plain container: %q (content listed %d times), want %q without listing", got, listed, b)
	}
	if got := root("overlayfs", "c-remap"); got != a || listed != 1 {
		t.Fatalf("remapped container: %q (content listed %d times), want %q", got, listed, a)
	}
	if got := root("native", "c-native"); got != remap || listed != 1 {
		t.Fatalf("remapped container on native, where a is not unpacked: %q (content listed %d times), want its parent %q", got, listed, remap)
	}

	// Content that cannot be listed leaves the listing's own chains.
	anc = listingAncestry(ix, facts, nil, func(context.Context) *contentIndex { return nil })
	if got := root("overlayfs", "c-remap"); got != remap {
		t.Fatalf("remapped container without content labels: %q, want its parent %q", got, remap)
	}
}
