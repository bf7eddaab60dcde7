package testenv

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

var (
	imageOnce sync.Once
	imageArch AgentImageArchive
	imageErr  error
)

// AgentImageArchive is the archive `make image` wrote.
type AgentImageArchive struct {
	Path string // bin/gcagent-image.tar in the module root
	Ref  string // the name containerd gives it on import (io.containerd.image.name)
}

// RepoRoot returns the module root (where the Makefile is).
func RepoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// AgentImage runs `make image` once per test process, so tests use the
// archive operators get (built from the current tree; the Go build cache
// makes a second run cheap), and returns it.
func AgentImage(t testing.TB) AgentImageArchive {
	t.Helper()
	_, err := exec.LookPath("make")
	Require(t, err == nil, "make")
	root := RepoRoot(t)
	imageOnce.Do(func() {
		cmd := exec.Command("make", "-s", "image")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("make image: %v\n%s", err, out)
			return
		}
		imageArch.Path = filepath.Join(root, "bin", "gcagent-image.tar")
		imageArch.Ref, imageErr = archiveRef(imageArch.Path)
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageArch
}

// archiveRef reads the image name from the archive's index.json.
func archiveRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("%s: no index.json: %w", path, err)
		}
		if h.Name != "index.json" {
			continue
		}
		var idx ocispec.Index
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", path, err)
		}
		for _, m := range idx.Manifests {
			if n := m.Annotations["io.containerd.image.name"]; n != "" {
				return n, nil
			}
		}
		return "", fmt.Errorf("%s: index.json names no image", path)
	}
}

// ImportArchive imports an image archive file into the daemon and unpacks
// every image it holds, as `ctr images import` does; it returns the names.
func (c *Containerd) ImportArchive(t testing.TB, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := c.Ctx()
	recs, err := c.Client.Import(ctx, io.Reader(f))
	if err != nil {
		t.Fatalf("import %s: %v", path, err)
	}
	var names []string
	for _, r := range recs {
		if err := client.NewImage(c.Client, r).Unpack(ctx, ""); err != nil {
			t.Fatalf("unpack %s: %v", r.Name, err)
		}
		names = append(names, r.Name)
	}
	return names
}
