package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gcagent/gcagent/gc"
)

// imageFsInfoer is the one CRI call ImageFS needs.
type imageFsInfoer interface {
	ImageFsInfo(ctx context.Context, in *runtime.ImageFsInfoRequest, opts ...grpc.CallOption) (*runtime.ImageFsInfoResponse, error)
}

// ImageFS measures the filesystem image GC protects, as the kubelet
// chooses it: the one holding CRI's image filesystem (the first entry of
// ImageFsInfo, containerd's snapshotter root), else Fallback (containerd's
// root) while CRI cannot say. An explicit Path is measured as given; when
// it is not on CRI's image filesystem, Note says so. Safe for concurrent use.
type ImageFS struct {
	Path     string // --image-fs; empty: ask CRI
	Fallback string // measured while CRI cannot say
	CRI      imageFsInfoer

	mu       sync.Mutex
	criPath  string // CRI's answer, once it gave one
	note     string
	lastTry  time.Time
	resolved bool
}

// NewImageFS returns an ImageFS; cri may be nil (no CRI plugin).
func NewImageFS(path, fallback string, cri runtime.ImageServiceClient) *ImageFS {
	f := &ImageFS{Path: path, Fallback: fallback}
	if cri != nil {
		f.CRI = cri
	}
	return f
}

// Disk statfs-es the chosen filesystem.
func (f *ImageFS) Disk() (gc.DiskStats, error) {
	return Statfs{Path: f.Chosen()}.Disk()
}

// Chosen returns the directory measured now, asking CRI (at most every 10 s
// until it answers) when no Path is set.
func (f *ImageFS) Chosen() string {
	f.resolve()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.Path != "":
		return f.Path
	case f.criPath != "":
		return f.criPath
	}
	return f.Fallback
}

// Note is what an operator should know about the choice: an explicit
// --image-fs that is not CRI's image filesystem, or CRI not answering.
func (f *ImageFS) Note() string {
	f.resolve()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.note
}

func (f *ImageFS) resolve() {
	f.mu.Lock()
	if f.resolved || f.CRI == nil || time.Since(f.lastTry) < 10*time.Second {
		if f.CRI == nil && !f.resolved && f.Path == "" {
			f.note = "no CRI: measuring " + f.Fallback
		}
		f.mu.Unlock()
		return
	}
	f.lastTry = time.Now()
	f.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.CRI.ImageFsInfo(ctx, &runtime.ImageFsInfoRequest{})
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || len(resp.GetImageFilesystems()) == 0 || resp.ImageFilesystems[0].GetFsId().GetMountpoint() == "" {
		if f.Path == "" {
			f.note = fmt.Sprintf("CRI image filesystem unknown (%v): measuring %s", err, f.Fallback)
		}
		return
	}
	f.criPath, f.resolved, f.note = resp.ImageFilesystems[0].FsId.Mountpoint, true, ""
	// CRI names a host path; in a pod that mounts containerd's root
	// elsewhere it cannot be seen: unknown is not different, so only a
	// path both sides can read and that differs is worth a note.
	if same, known := sameFilesystem(f.Path, f.criPath); f.Path != "" && known && !same {
		f.note = fmt.Sprintf("--image-fs %s is not on CRI's image filesystem %s: the kubelet measures %s", f.Path, f.criPath, f.criPath)
	}
}

// sameFilesystem reports whether a and b are on one filesystem (same
// device); known is false when either cannot be read.
func sameFilesystem(a, b string) (same, known bool) {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false, false
	}
	return sa.Dev == sb.Dev, true
}
