package node

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
)

var _ deletion.Checker = (*Runtime)(nil)

// Gone reports whether the object of a delete intent no longer exists as
// it did when the intent was recorded: an image none of whose names is
// older than the intent; a container not found, or made again after the
// intent; a log path not found. It is how a delete whose outcome is
// unknown (a crash, a call that failed) is settled.
func (r *Runtime) Gone(ctx context.Context, it deletion.Intent) (bool, error) {
	ctx = in(ctx, intentNamespace(it))
	switch it.Kind {
	case "image":
		imgs, err := r.Client.ImageService().List(ctx, "target.digest=="+strconv.Quote(it.Subject))
		if err != nil {
			return false, err
		}
		for _, img := range imgs {
			if !img.CreatedAt.After(it.At) {
				return false, nil // a name older than the intent survived: not deleted
			}
		}
		return true, nil
	case "container":
		c, err := r.Client.ContainerService().Get(ctx, it.Subject)
		if errdefs.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return c.CreatedAt.After(it.At), nil
	case "log":
		// A log's fate is known from the file system alone: gone when
		// its path is (ENOTDIR: a parent is no dir any more), else there,
		// also when it cannot be read (the intent is dropped rather than
		// holding every delete for ever).
		_, err := os.Lstat(it.Subject)
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR), nil
	}
	// A kind this version does not know (left by a newer one) cannot be
	// settled: it is dropped, never holding every delete for ever.
	return false, nil
}

// intentNamespace is the containerd namespace of the object an intent is
// about: its own, else its data's (intents recorded before they carried
// one), else CRI's (before namespaces were managed).
func intentNamespace(it deletion.Intent) string {
	if it.Namespace != "" {
		return it.Namespace
	}
	var d struct {
		Namespace string `json:"namespace"`
	}
	if json.Unmarshal(it.Data, &d) != nil || d.Namespace == "" {
		return events.CRINamespace
	}
	return d.Namespace
}
