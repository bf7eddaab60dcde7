package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
)

var _ deletion.Checker = (*Runtime)(nil)

// Gone reports whether the object of a delete intent no longer exists as
// it did when the intent was recorded, by its identity (never by a clock):
// an image none of whose recorded names is there with its recorded
// creation time; a container not found, or found with another creation
// time (made again under its id); a log path not found. An intent without
// an identity (recorded by an earlier version) fails closed: an image with
// any name on its digest, a container found, is not gone. It is how a
// delete whose outcome is unknown (a crash, a call that failed) is
// settled.
func (r *Runtime) Gone(ctx context.Context, it deletion.Intent) (bool, error) {
	ctx = in(ctx, intentNamespace(it))
	switch it.Kind {
	case "image":
		imgs, err := r.Client.ImageService().List(ctx, "target.digest=="+strconv.Quote(it.Subject))
		if err != nil {
			return false, err
		}
		for _, img := range imgs {
			if img.Target.Digest.String() != it.Subject { // the filter is the daemon's; trust but verify
				continue
			}
			if it.Identity.NameSurvives(img.Name, img.CreatedAt) {
				return false, nil // a name the delete was about survived: not deleted
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
		return it.Identity.ContainerGone(true, r.created(c.CreatedAt)), nil
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

// ContainerCreated returns the creation time containerd stamped on
// container id of namespace ns (as the projection records it: with the
// test-only StampSkew), the identity its delete intent records;
// gc.ErrOwnerWon when it is gone.
func (r *Runtime) ContainerCreated(ctx context.Context, ns, id string) (time.Time, error) {
	c, err := r.Client.ContainerService().Get(in(ctx, ns), id)
	if errdefs.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("container %q: %w", id, gc.ErrOwnerWon)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read container %q: %w", id, err)
	}
	return r.created(c.CreatedAt), nil
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
