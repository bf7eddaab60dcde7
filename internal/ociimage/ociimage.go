// Package ociimage writes gcagent's container image as an OCI image archive
// (an OCI layout in a tar, plus Docker's manifest.json) from the static
// binaries alone (the agent, and the cluster component beside it): no registry, no base image and no Dockerfile, so `make
// image` works on a machine that can reach only the Go module proxy, and the
// same bytes come out of the same binary.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BinaryPath is where the agent's binary sits in the image; it is the
// entrypoint.
const BinaryPath = "/gcagent"

// ClusterBinaryPath is where gcagent-cluster sits in the image: the chart's
// Deployment runs it as its command, so that one image serves both.
const ClusterBinaryPath = "/gcagent-cluster"

// Options describes the image. Name and Version make the reference
// Name:Version, the form `docker load` and `ctr images import` show.
type Options struct {
	// Binary is the path of the static gcagent binary to put at /gcagent.
	Binary string
	// ClusterBinary is the path of the static gcagent-cluster binary to
	// put at /gcagent-cluster.
	ClusterBinary string
	// Name is the repository, default "gcagent".
	Name string
	// Version is the tag and the org.opencontainers.image.version label.
	Version string
	// Commit is the org.opencontainers.image.revision label.
	Commit string
	// Created stamps the config, history and file times; the commit time
	// keeps the archive reproducible. Default: the Unix epoch.
	Created time.Time
	// Arch is the GOARCH the binary was built for, default runtime.GOARCH.
	Arch string
}

// Ref returns the short reference of the image, Name:Version.
func (o Options) Ref() string { return o.name() + ":" + o.Version }

// FullRef returns the reference containerd and CRI use for Ref, normalized
// the way `docker.io/library/...` names are.
func (o Options) FullRef() string { return "docker.io/library/" + o.Ref() }

func (o Options) name() string {
	if o.Name == "" {
		return "gcagent"
	}
	return o.Name
}

// Build writes the archive of the image to w. It fails when a binary
// cannot be read, or Version or a binary's path is empty.
func Build(w io.Writer, o Options) error {
	if o.Version == "" {
		return fmt.Errorf("image version is empty")
	}
	if o.Binary == "" || o.ClusterBinary == "" {
		return fmt.Errorf("the image needs both binaries: gcagent (%q) and gcagent-cluster (%q)", o.Binary, o.ClusterBinary)
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	var files []layerFile
	for _, f := range []struct{ src, dst string }{{o.Binary, BinaryPath}, {o.ClusterBinary, ClusterBinaryPath}} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			return fmt.Errorf("read the binary for %s: %w", f.dst, err)
		}
		files = append(files, layerFile{path: f.dst, data: b})
	}
	layer, diffID, err := layerOf(files, o.Created)
	if err != nil {
		return err
	}
	layerDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(layer), Size: int64(len(layer))}
	created := o.Created.UTC()
	labels := map[string]string{
		"org.opencontainers.image.title":       "gcagent",
		"org.opencontainers.image.description": "event-sourced garbage collector for containerd nodes",
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Commit,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	cfg, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{OS: "linux", Architecture: o.Arch},
		Config: ocispec.ImageConfig{
			Entrypoint: []string{BinaryPath},
			Cmd:        []string{"run"},
			Labels:     labels,
		},
		RootFS:  ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
		History: []ocispec.History{{Created: &created, CreatedBy: "gcagent ociimage: " + BinaryPath + " " + ClusterBinaryPath}},
	})
	if err != nil {
		return err
	}
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfgDesc, Layers: []ocispec.Descriptor{layerDesc}, Annotations: map[string]string{"org.opencontainers.image.version": o.Version},
	})
	if err != nil {
		return err
	}
	mfDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifest), Size: int64(len(manifest)),
		Platform: &ocispec.Platform{OS: "linux", Architecture: o.Arch},
		Annotations: map[string]string{
			// containerd names the image by this annotation on import.
			"io.containerd.image.name": o.FullRef(),
			ocispec.AnnotationRefName:  o.Version,
		}}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{mfDesc},
	})
	if err != nil {
		return err
	}
	// manifest.json lets `docker load` (and tools that only know Docker's
	// format) read the same archive.
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config": blobPath(cfgDesc.Digest), "RepoTags": []string{o.Ref()}, "Layers": []string{blobPath(layerDesc.Digest)},
	}})
	if err != nil {
		return err
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})

	tw := tar.NewWriter(w)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{ocispec.ImageLayoutFile, layout},
		{blobPath(layerDesc.Digest), layer},
		{blobPath(cfgDesc.Digest), cfg},
		{blobPath(mfDesc.Digest), manifest},
		{"index.json", index},
		{"manifest.json", dockerManifest},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: o.Created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func blobPath(d digest.Digest) string { return "blobs/" + d.Algorithm().String() + "/" + d.Encoded() }

// layerFile is an executable of the layer: its absolute path and bytes.
type layerFile struct {
	path string
	data []byte
}

// layerOf returns the gzipped layer holding files (mode 0755, in their
// order) and the digest of the uncompressed tar (the diff id).
func layerOf(files []layerFile, mtime time.Time) ([]byte, digest.Digest, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		hdr := &tar.Header{Name: f.path[1:], Mode: 0o755, Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	diffID := digest.FromBytes(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), diffID, nil
}
