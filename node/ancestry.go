package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// A container's rootfs snapshot is usually prepared straight from its
// image's top chain id, but not always: `ctr run --uidmap/--gidmap` (the
// client's WithRemappedSnapshot) prepares it from a remapped copy, a
// committed snapshot (named <chain>-<uid>-<gid> by containerd 1.6, a digest
// by 2.x) whose parent is the chain id. So the image a rootfs runs is its
// nearest ancestor that is the top of an image: never one further up (a
// derived image's chain has its base image's top for parent), and the
// direct parent when no ancestor is (an image deleted since, layers of
// unknown origin), as before.

// maxAncestry bounds the snapshots rootChain looks at above a rootfs: a
// remapped copy is one, and a chain of committed layers above a deleted
// image is as deep as its layers.
const maxAncestry = 32

// ancestry is what rootChain reads of one namespace's snapshotters: the
// listing's index of every snapshot, or calls to containerd for a lookup.
type ancestry struct {
	// parent returns the parent of snapshot name on snapshotter sn, ""
	// for a snapshot without one or one that is gone.
	parent func(ctx context.Context, sn, name string) (string, error)
	// top reports whether chain is the top of an image unpacked on sn:
	// the rule of (*imageTops).imageTop.
	top func(ctx context.Context, sn, chain string) (bool, error)
}

// rootChain returns the chain id of the image the snapshot key of
// snapshotter sn (a container's rootfs) was prepared from: its nearest
// ancestor, at most maxAncestry up, that is the top of an image unpacked on
// sn; else its direct parent ("" if it has none or is gone). A walk that
// fails returns the direct parent with the error, so a caller may use it
// or try again.
func (a ancestry) rootChain(ctx context.Context, sn, key string) (string, error) {
	direct, err := a.parent(ctx, sn, key)
	if err != nil || direct == "" {
		return "", err
	}
	seen := map[string]bool{key: true}
	for p, n := direct, 0; p != "" && n < maxAncestry && !seen[p]; n++ {
		seen[p] = true
		top, err := a.top(ctx, sn, p)
		if err != nil {
			return direct, err
		}
		if top {
			return p, nil
		}
		if p, err = a.parent(ctx, sn, p); err != nil {
			return direct, err
		}
	}
	return direct, nil
}

// imageTops answers imageTop, remembering the chains it found to be tops.
// It is safe for concurrent use.
type imageTops struct {
	cs    content.Store
	mu    sync.Mutex
	known map[topKey]struct{}
}

type topKey struct{ namespace, snapshotter, chain string }

// maxKnownTops bounds the tops imageTops remembers; past it, it forgets
// them all and asks again.
const maxKnownTops = 4096

// newImageTops returns an imageTops reading the content store cs.
func newImageTops(cs content.Store) *imageTops {
	return &imageTops{cs: cs, known: map[topKey]struct{}{}}
}

// errFound ends a content walk at the first match.
var errFound = errors.New("found")

// imageTop reports whether chain is the top chain id of an image unpacked
// on snapshotter sn in the namespace of ctx: whether some content blob
// carries the label containerd.io/gc.ref.snapshot.<sn> with chain as its
// value. containerd's unpacker (1.6 and 2.x) sets that label on the
// image's config when it commits the top layer's snapshot, and containerd's
// garbage collector removes the blob with the last image that holds it.
// It costs one filtered content walk; an error is that walk's.
//
// A true answer is remembered, per namespace, snapshotter and chain (a
// chain id names the same layers for ever), so asking again about a top
// costs nothing; a false one is asked again each time. A remembered answer
// outlives the image: until maxKnownTops later answers, a chain whose
// image was deleted is still a top here. A caller that must not see that
// (rootChain would stop at such a chain instead of going on to the next
// image up) uses an imageTops of its own for as long as it may.
func (t *imageTops) imageTop(ctx context.Context, sn, chain string) (bool, error) {
	ns, _ := namespaces.Namespace(ctx)
	k := topKey{ns, sn, chain}
	t.mu.Lock()
	_, ok := t.known[k]
	t.mu.Unlock()
	if ok {
		return true, nil
	}
	ctx, cancel := context.WithCancel(ctx) // ends the stream a match leaves unread
	defer cancel()
	label := labelSnapshotRef + sn
	found := false
	err := t.cs.Walk(ctx, func(info content.Info) error {
		if info.Labels[label] == chain { // the filter is the daemon's; trust but verify
			found = true
			return errFound
		}
		return nil
	}, "labels."+strconv.Quote(label)+"=="+strconv.Quote(chain))
	if err != nil && !errors.Is(err, errFound) {
		return false, fmt.Errorf("content labelled %s=%s: %w", label, chain, err)
	}
	if found {
		t.mu.Lock()
		if len(t.known) >= maxKnownTops {
			clear(t.known)
		}
		t.known[k] = struct{}{}
		t.mu.Unlock()
	}
	return found, nil
}

// tops returns, from the content index of a listing, the chains labelled
// as image tops, by snapshotter (nil when ix is nil).
func (ix *contentIndex) tops() map[string]map[string]bool {
	if ix == nil {
		return nil
	}
	out := map[string]map[string]bool{}
	for _, b := range ix.blobs {
		for _, l := range b.labels {
			if sn, ok := strings.CutPrefix(l.key, labelSnapshotRef); ok && sn != "" {
				if out[sn] == nil {
					out[sn] = map[string]bool{}
				}
				out[sn][l.value] = true
			}
		}
	}
	return out
}

// listingAncestry is rootChain's view in a listing: the parents the
// snapshot walk indexed, and for tops first the chains of the listing's
// images (facts: an image's top chain found above a rootfs on a
// snapshotter was unpacked there), then the labels of the content index
// cix (the one the facts were read with), or of the one listContent lists
// at the first chain that is neither when cix is nil. A listing of
// containers that all run their image's top asks containerd nothing more.
func listingAncestry(ix snapshotIndex, facts map[string]ImageFacts, cix *contentIndex,
	listContent func(context.Context) *contentIndex) ancestry {
	chains := make(map[string]bool, len(facts))
	for _, f := range facts {
		if f.Chain != "" {
			chains[f.Chain] = true
		}
	}
	var labelled map[string]map[string]bool // snapshotter -> chain -> top
	return ancestry{
		parent: func(_ context.Context, sn, name string) (string, error) {
			return ix.parents[snapshotRef{sn, name}], nil
		},
		top: func(ctx context.Context, sn, chain string) (bool, error) {
			if chains[chain] {
				return true, nil
			}
			if labelled == nil {
				if cix == nil {
					cix = listContent(ctx)
				}
				labelled = cix.tops()
				if labelled == nil {
					labelled = map[string]map[string]bool{} // not listed: the facts' chains alone
				}
			}
			return labelled[sn][chain], nil
		},
	}
}

// lookupAncestry is rootChain's view for one lookup: a Stat per snapshot
// and imageTop per chain.
func (s *Source) lookupAncestry() ancestry {
	return ancestry{
		parent: func(ctx context.Context, sn, name string) (string, error) {
			info, err := s.o.Client.SnapshotService(sn).Stat(ctx, name)
			if errdefs.IsNotFound(err) {
				return "", nil
			}
			if err != nil {
				return "", fmt.Errorf("stat snapshot %s of %s: %w", name, sn, err)
			}
			return info.Parent, nil
		},
		top: s.tops.imageTop,
	}
}
