package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/defaults"
)

// snapshotterConfig is the daemon config that makes sn CRI's snapshotter:
// appended to config(), it only adds tables config() does not write.
func (c *Containerd) snapshotterConfig(sn string) string {
	if c.Version == V16 {
		return fmt.Sprintf("[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = %q\n", sn)
	}
	return fmt.Sprintf("[plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = %q\n", sn)
}

// SetDefaultSnapshotter makes sn the daemon's default snapshotter, for a
// daemon that holds nothing yet: it restarts the daemon with sn as CRI's
// snapshotter, and labels the view's namespace (Namespace unless
// InNamespace chose another) with containerd.io/defaults/snapshotter=sn,
// which is how containerd clients (this package's Import and CreateNative,
// ctr, nerdctl) pick their default. A later RestartWithSendLimit writes the
// config without it.
func (c *Containerd) SetDefaultSnapshotter(t testing.TB, sn string) {
	t.Helper()
	cfg := c.config() + c.snapshotterConfig(sn)
	if err := os.WriteFile(filepath.Join(c.Dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Restart()
	ctx := c.Ctx()
	ns := Namespace
	if c.ns != "" {
		ns = c.ns
	}
	nss := c.Client.NamespaceService()
	if err := nss.Create(ctx, ns, nil); err != nil {
		if _, gerr := nss.Labels(ctx, ns); gerr != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	if err := nss.SetLabel(ctx, ns, defaults.DefaultSnapshotterNSLabel, sn); err != nil {
		t.Fatalf("label namespace %s: %v", ns, err)
	}
}
