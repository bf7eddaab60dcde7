// Command mkimage writes gcagent's OCI image archive: `make image` runs it
// on the static binaries that it built (the agent and gcagent-cluster).
//
//	go run ./internal/ociimage/mkimage -binary bin/gcagent-static -version v1 -commit abc -created 1700000000 \
//		-cluster-binary bin/gcagent-cluster-static -o bin/gcagent-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gcagent/gcagent/internal/ociimage"
)

func main() {
	var o ociimage.Options
	var out string
	var created int64
	flag.StringVar(&o.Binary, "binary", "", "static gcagent binary (at /gcagent)")
	flag.StringVar(&o.ClusterBinary, "cluster-binary", "", "static gcagent-cluster binary (at /gcagent-cluster)")
	flag.StringVar(&o.Version, "version", "", "image tag and version label")
	flag.StringVar(&o.Commit, "commit", "", "revision label")
	flag.StringVar(&o.Arch, "arch", "", "GOARCH of the binary (default: this machine's)")
	flag.Int64Var(&created, "created", 0, "creation time, Unix seconds (the commit time keeps the archive reproducible)")
	flag.StringVar(&out, "o", "bin/gcagent-image.tar", "output archive")
	flag.Parse()
	if o.Binary == "" || o.ClusterBinary == "" || o.Version == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "mkimage: -binary, -cluster-binary and -version are required, no arguments")
		os.Exit(2)
	}
	o.Created = time.Unix(created, 0).UTC()
	if err := write(out, o); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s (%s)\n", out, o.Ref(), o.FullRef())
}

// write builds the archive next to out and renames it into place, so a
// failed build never leaves a truncated archive behind.
func write(out string, o ociimage.Options) error {
	f, err := os.CreateTemp(filepath.Dir(out), ".gcagent-image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := ociimage.Build(f, o); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}
