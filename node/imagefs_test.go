package node

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type fakeImageFs struct {
	mountpoint string
	err        error
	calls      int
}

func (f *fakeImageFs) ImageFsInfo(context.Context, *runtime.ImageFsInfoRequest, ...grpc.CallOption) (*runtime.ImageFsInfoResponse, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &runtime.ImageFsInfoResponse{ImageFilesystems: []*runtime.FilesystemUsage{
		{FsId: &runtime.FilesystemIdentifier{Mountpoint: f.mountpoint}},
		{FsId: &runtime.FilesystemIdentifier{Mountpoint: "/second/is/ignored"}},
	}}, nil
}

var _ imageFsInfoer = (*fakeImageFs)(nil)

// TestImageFSChoice: CRI's first image filesystem when no path is given,
// the fallback while CRI cannot say, and a given path as given, with a note
// when it is not on CRI's filesystem.
func TestImageFSChoice(t *testing.T) {
	cri := t.TempDir()
	f := &ImageFS{Fallback: "/fallback", CRI: &fakeImageFs{mountpoint: cri}}
	if got := f.Chosen(); got != cri || f.Note() != "" {
		t.Errorf("auto: chose %s (note %q), want %s", got, f.Note(), cri)
	}

	down := &fakeImageFs{err: errors.New("unavailable")}
	f = &ImageFS{Fallback: "/fallback", CRI: down}
	if got := f.Chosen(); got != "/fallback" || !strings.Contains(f.Note(), "unknown") {
		t.Errorf("CRI down: chose %s (note %q)", got, f.Note())
	}
	if down.calls != 1 {
		t.Errorf("CRI asked %d times within 10s, want once", down.calls)
	}

	f = &ImageFS{Path: "/proc", Fallback: "/fallback", CRI: &fakeImageFs{mountpoint: cri}}
	if got := f.Chosen(); got != "/proc" || !strings.Contains(f.Note(), "not on CRI's image filesystem") {
		t.Errorf("explicit elsewhere: chose %s (note %q)", got, f.Note())
	}
	f = &ImageFS{Path: cri, Fallback: "/fallback", CRI: &fakeImageFs{mountpoint: cri}}
	if got := f.Chosen(); got != cri || f.Note() != "" {
		t.Errorf("explicit, same filesystem: chose %s (note %q)", got, f.Note())
	}
}

// TestImageFSNoteOnlyWhenKnownDifferent: a CRI path the agent cannot see
// (a pod that mounts containerd's root elsewhere, k3s's root under
// /var/lib/rancher) is unknown, not different: no note. At 7485972 every
// start warned that --image-fs was not on CRI's image filesystem, and
// /readyz said so for ever.
func TestImageFSNoteOnlyWhenKnownDifferent(t *testing.T) {
	given := t.TempDir()
	f := &ImageFS{Path: given, Fallback: "/fallback", CRI: &fakeImageFs{mountpoint: "/var/lib/rancher/k3s/agent/containerd/not-mounted-here"}}
	if got := f.Chosen(); got != given || f.Note() != "" {
		t.Errorf("CRI's path unseen: chose %s (note %q), want %s and no note", got, f.Note(), given)
	}
}
