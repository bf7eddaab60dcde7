package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestBuildIsConsistent reads the archive back as an importer would: every
// descriptor points at a blob of that digest and size, the layer's diff id
// matches, the agent's binary is at /gcagent as the entrypoint and
// gcagent-cluster's at /gcagent-cluster (the chart's Deployment runs it),
// both executable, and two builds of the same binaries are byte-identical.
// A build without either binary fails.
func TestBuildIsConsistent(t *testing.T) {
	dir := t.TempDir()
	bin, clusterBin := filepath.Join(dir, "gcagent"), filepath.Join(dir, "gcagent-cluster")
	payload := []byte("#!/bin/true\nnot really a binary\n")
	clusterPayload := []byte("#!/bin/true\nnot really the cluster component\n")
	if err := os.WriteFile(bin, payload, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(clusterBin, clusterPayload, 0o755); err != nil {
		t.Fatal(err)
	}
	o := Options{Binary: bin, ClusterBinary: clusterBin, Version: "v1.2.3", Commit: "abc", Created: time.Unix(1700000000, 0)}
	var a, b bytes.Buffer
	if err := Build(&a, o); err != nil {
		t.Fatal(err)
	}
	if err := Build(&b, o); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two builds of the same binary differ")
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&a)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], _ = io.ReadAll(tr)
	}
	blob := func(d ocispec.Descriptor) []byte {
		t.Helper()
		data, ok := files[blobPath(d.Digest)]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if digest.FromBytes(data) != d.Digest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s: digest or size does not match its descriptor", d.Digest)
		}
		return data
	}
	var idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v %+v", err, idx)
	}
	if got := idx.Manifests[0].Annotations["io.containerd.image.name"]; got != "docker.io/library/gcagent:v1.2.3" {
		t.Errorf("image name annotation %q", got)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(blob(idx.Manifests[0]), &m); err != nil || len(m.Layers) != 1 {
		t.Fatalf("manifest: %v %+v", err, m)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(blob(m.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/gcagent" || cfg.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("config: %+v", cfg.Config)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	if digest.FromBytes(raw) != cfg.RootFS.DiffIDs[0] {
		t.Error("diff id is not the digest of the uncompressed layer")
	}
	lr := tar.NewReader(bytes.NewReader(raw))
	for _, want := range []struct {
		name string
		data []byte
	}{{"gcagent", payload}, {"gcagent-cluster", clusterPayload}} {
		h, err := lr.Next()
		if err != nil || h.Name != want.name || h.Mode != 0o755 || h.Typeflag != tar.TypeReg {
			t.Fatalf("layer entry: %v %+v, want the executable %s", err, h, want.name)
		}
		if got, _ := io.ReadAll(lr); !bytes.Equal(got, want.data) {
			t.Errorf("layer's %s is not the binary given", want.name)
		}
	}
	if h, err := lr.Next(); err != io.EOF {
		t.Errorf("layer holds more: %+v %v", h, err)
	}
	var dm []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &dm); err != nil || len(dm) != 1 || dm[0].RepoTags[0] != "gcagent:v1.2.3" || dm[0].Config != blobPath(m.Config.Digest) {
		t.Errorf("manifest.json: %v %+v", err, dm)
	}
	for name, bad := range map[string]Options{
		"no version":                {Binary: bin, ClusterBinary: clusterBin},
		"no cluster binary":         {Binary: bin, Version: "v1"},
		"no agent binary":           {ClusterBinary: clusterBin, Version: "v1"},
		"cluster binary unreadable": {Binary: bin, ClusterBinary: filepath.Join(dir, "missing"), Version: "v1"},
	} {
		if err := Build(io.Discard, bad); err == nil {
			t.Errorf("%s: built", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
