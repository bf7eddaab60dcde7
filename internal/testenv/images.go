package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
)

// Layer describes one generated layer. Layers with the same fields have the
// same digest, so images that list the same Layer share it on disk.
type Layer struct {
	// Seed and Size make a file of Size random (incompressible) bytes.
	Seed string
	Size int64
	// Busybox adds busybox-static as /bin/busybox with sh, sleep and true.
	Busybox bool
}

// Image describes a generated image.
type Image struct {
	Name       string
	Layers     []Layer
	Entrypoint []string
	Cmd        []string
}

// BusyboxLayer is the layer every runnable test image starts with.
var BusyboxLayer = Layer{Busybox: true}

// Runnable returns an image that can run processes, with extra data layers.
func Runnable(name string, data ...Layer) Image {
	return Image{Name: name, Layers: append([]Layer{BusyboxLayer}, data...), Cmd: []string{"/bin/sh"}}
}

// Pause returns a pause image: busybox sleeping forever.
func Pause(name string) Image {
	return Image{Name: name, Layers: []Layer{BusyboxLayer}, Entrypoint: []string{"/bin/sleep"}, Cmd: []string{"2147483647"}}
}

// layerTar builds the uncompressed tar of a layer.
func layerTar(l Layer) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	}
	if l.Busybox {
		bb, err := os.ReadFile(busyboxPath())
		if err != nil {
			return nil, fmt.Errorf("busybox-static: %w", err)
		}
		for _, d := range []string{"bin/", "tmp/", "etc/", "proc/", "sys/", "dev/"} {
			if err := dir(d); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(bb); err != nil {
			return nil, err
		}
		for _, app := range []string{"sh", "sleep", "true", "false", "echo", "cat"} {
			if err := tw.WriteHeader(&tar.Header{Name: "bin/" + app, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
				return nil, err
			}
		}
	}
	if l.Size > 0 {
		if err := dir("data/"); err != nil {
			return nil, err
		}
		name := "data/" + hashString(l.Seed)[:16]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: l.Size, ModTime: mtime}); err != nil {
			return nil, err
		}
		seed := sha256.Sum256([]byte(l.Seed))
		if _, err := io.CopyN(tw, rand.NewChaCha8(seed), l.Size); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func busyboxPath() string {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/bin/busybox"
}

// HasBusybox reports whether busybox-static is installed.
func HasBusybox() bool {
	_, err := os.Stat(busyboxPath())
	return err == nil
}

func hashString(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func sha(b []byte) string { return "sha256:" + hashString(string(b)) }

// Archive writes a Docker image archive (manifest.json, configs, layer tars)
// holding imgs. Layers shared between images are stored once.
func Archive(w io.Writer, imgs ...Image) error {
	tw := tar.NewWriter(w)
	written := map[string]bool{}
	put := func(name string, b []byte) error {
		if written[name] {
			return nil
		}
		written[name] = true
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	type entry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var manifest []entry
	for _, img := range imgs {
		var diffIDs, paths []string
		for _, l := range img.Layers {
			b, err := layerTar(l)
			if err != nil {
				return err
			}
			id := sha(b)
			path := id[len("sha256:"):] + "/layer.tar"
			if err := put(path, b); err != nil {
				return err
			}
			diffIDs = append(diffIDs, id)
			paths = append(paths, path)
		}
		cfg, err := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"created":      "2026-01-01T00:00:00Z",
			"config": map[string]any{
				"Env":        []string{"PATH=/bin"},
				"Entrypoint": img.Entrypoint,
				"Cmd":        img.Cmd,
				"Labels":     map[string]string{"gcagent.test/name": img.Name},
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return err
		}
		cfgPath := hashString(string(cfg)) + ".json"
		if err := put(cfgPath, cfg); err != nil {
			return err
		}
		manifest = append(manifest, entry{Config: cfgPath, RepoTags: []string{img.Name}, Layers: paths})
	}
	mb, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	if err := put("manifest.json", mb); err != nil {
		return err
	}
	return tw.Close()
}

// Import builds imgs, imports them into the daemon and unpacks them for the
// default snapshotter, as a pull would. It returns the created image records.
func (c *Containerd) Import(t testing.TB, imgs ...Image) []images.Image {
	t.Helper()
	return c.importIn(t, c.Ctx(), imgs)
}

// ImportLeased is Import under one lease, as `ctr images import` and a pull
// do: an agent under pressure with no minimum age may delete an unused
// image the moment the lease ends, but not between the import and the
// unpack (Import unpacks outside a lease).
func (c *Containerd) ImportLeased(t testing.TB, imgs ...Image) []images.Image {
	t.Helper()
	ctx, done, err := c.Client.WithLease(c.Ctx())
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	defer func() {
		if err := done(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("end lease: %v", err)
		}
	}()
	return c.importIn(t, ctx, imgs)
}

func (c *Containerd) importIn(t testing.TB, ctx context.Context, imgs []Image) []images.Image {
	t.Helper()
	Require(t, HasBusybox(), "busybox-static")
	var buf bytes.Buffer
	if err := Archive(&buf, imgs...); err != nil {
		t.Fatalf("build archive: %v", err)
	}
	recs, err := c.Client.Import(ctx, &buf)
	if err != nil {
		t.Fatalf("import %d images: %v", len(imgs), err)
	}
	for _, r := range recs {
		if err := client.NewImage(c.Client, r).Unpack(ctx, ""); err != nil {
			t.Fatalf("unpack %s: %v", r.Name, err)
		}
	}
	return recs
}
