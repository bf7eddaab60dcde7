package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ispecs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

// Seed says what SeedRecords writes: records only, no snapshots, no tasks
// and no pulls, so a daemon looks like a busy node's in seconds.
type Seed struct {
	// Images distinct images, each with its own config and manifest and one
	// shared 1 KiB layer, named ImageName(i). Each config carries the label
	// containerd's unpacker puts on it once an image is unpacked for
	// overlayfs (as every image CRI pulls is): the chain id of its top layer,
	// unless Fetched.
	Images int
	// Fetched leaves the images as a pull that does not unpack leaves them
	// (`ctr content fetch`, buildkit, a pre-pull cache): the manifest
	// labelled with its children, the config without the unpacker's chain
	// id, so that whoever wants it reads the config.
	Fetched bool
	// Containers containers, named ContainerID(i), container i running image
	// i%Images. Even ones are labelled like CRI containers of a pod (kind
	// container, pod uid, name and namespace, container name), with a spec
	// of a CRI container's size (CRI's annotations, the kubelet's
	// environment and mounts, the default seccomp profile: about 10 KiB of
	// JSON) and CRI's metadata extension (the container config and the
	// image id); odd ones are plain.
	Containers int
	// Prefix makes the names distinct from other seeds in the daemon
	// (default "seed").
	Prefix string
	// Workers bounds the requests in flight (default 16).
	Workers int
	// CRIManaged makes each image look pulled through CRI: its name and a
	// second name, its image id (config digest), both labelled
	// io.cri-containerd.image=managed. Otherwise containerd's CRI plugin
	// does that itself, in the background, for every image it sees created
	// (two image events each, long after the seeding on a 10,000-image
	// daemon).
	CRIManaged bool
	// Terminal gives the CRI containers a terminal (their config's tty):
	// containerd 1.6's CRI then holds one output FIFO open, not two, for
	// each container it loads created and not started, which lets tens of
	// thousands of them fit the open-file limit of this sandbox.
	Terminal bool
	// RootfsKeys gives each container the rootfs snapshot key CRI gives
	// its own (the container's id, on overlayfs), of a snapshot never
	// prepared: whoever follows the container asks for that snapshot, as
	// for a real one, and hears it is not there.
	RootfsKeys bool
}

func (s Seed) prefix() string {
	if s.Prefix == "" {
		return "seed"
	}
	return s.Prefix
}

// ImageName is the name of seeded image i.
func (s Seed) ImageName(i int) string { return fmt.Sprintf("%s.test/img-%05d:1", s.prefix(), i) }

// ContainerID is the id of seeded container i.
func (s Seed) ContainerID(i int) string { return fmt.Sprintf("%s-%05d", s.prefix(), i) }

// SeedContainer returns seeded container i's record (also for containers
// created later, e.g. to churn): image i%s.Images, CRI labels when i is even.
func (s Seed) SeedContainer(i int) (containers.Container, error) {
	labels := map[string]string{}
	spec := &specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"/bin/app", fmt.Sprint(i)}, Cwd: "/"}}
	if i%2 == 0 {
		uid := fmt.Sprintf("%s-pod-%05d", s.prefix(), i/8)
		labels = map[string]string{
			"io.cri-containerd.kind":       "container",
			"io.kubernetes.pod.uid":        uid,
			"io.kubernetes.pod.name":       fmt.Sprintf("app-%05d", i/8),
			"io.kubernetes.pod.namespace":  "default",
			"io.kubernetes.container.name": fmt.Sprintf("c%d", i%8/2),
		}
		criSpec(spec)
		spec.Annotations = map[string]string{
			"io.kubernetes.cri.container-type":    "container",
			"io.kubernetes.cri.container-name":    fmt.Sprintf("c%d", i%8/2),
			"io.kubernetes.cri.sandbox-id":        digest.FromString(uid).Encoded(),
			"io.kubernetes.cri.sandbox-uid":       uid,
			"io.kubernetes.cri.sandbox-name":      fmt.Sprintf("app-%05d", i/8),
			"io.kubernetes.cri.sandbox-namespace": "default",
			"io.kubernetes.cri.image-name":        s.ImageName(i % max(s.Images, 1)),
		}
	}
	a, err := typeurl.MarshalAny(spec)
	if err != nil {
		return containers.Container{}, err
	}
	rec := containers.Container{
		ID: s.ContainerID(i), Image: s.ImageName(i % max(s.Images, 1)), Labels: labels,
		Runtime: containers.RuntimeInfo{Name: "io.containerd.runc.v2"}, Spec: a,
	}
	if s.RootfsKeys {
		rec.Snapshotter, rec.SnapshotKey = "overlayfs", rec.ID
	}
	if i%2 == 0 {
		meta, err := json.Marshal(map[string]any{"Version": "v1", "Metadata": map[string]any{
			"ID": rec.ID, "Name": criName(labels), "SandboxID": spec.Annotations["io.kubernetes.cri.sandbox-id"],
			"ImageRef": digest.FromBytes(s.imageConfig(i % max(s.Images, 1))).String(),
			"Config": map[string]any{
				"metadata": map[string]any{"name": labels["io.kubernetes.container.name"]},
				"image":    map[string]any{"image": rec.Image},
				"command":  spec.Process.Args, "envs": criEnvs(spec.Process.Env), "labels": labels, "annotations": spec.Annotations,
				"tty":    s.Terminal,
				"mounts": []map[string]any{{"container_path": "/var/run/secrets/kubernetes.io/serviceaccount", "host_path": "/var/lib/kubelet/pods/" + labels["io.kubernetes.pod.uid"] + "/volumes/token", "readonly": true}},
			},
			"LogPath": "/var/log/pods/" + labels["io.kubernetes.pod.uid"] + "/app/0.log", "StopSignal": "SIGTERM",
		}})
		if err != nil {
			return containers.Container{}, err
		}
		rec.Extensions = map[string]typeurl.Any{
			"io.cri-containerd.container.metadata": &anypb.Any{TypeUrl: "github.com/containerd/cri/pkg/store/container/Metadata", Value: meta},
		}
	}
	return rec, nil
}

// criName is a container's unique name in CRI's metadata, as CRI makes it:
// container, pod, pod namespace, pod uid and attempt.
func criName(labels map[string]string) string {
	return strings.Join([]string{labels["io.kubernetes.container.name"], labels["io.kubernetes.pod.name"],
		labels["io.kubernetes.pod.namespace"], labels["io.kubernetes.pod.uid"], "0"}, "_")
}

// criEnvs is env as CRI's container config has it (key-value objects).
func criEnvs(env []string) []map[string]string {
	out := make([]map[string]string, len(env))
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = map[string]string{"key": k, "value": v}
	}
	return out
}

// criSpec fills spec in as CRI does for a pod's container: the kubelet's
// environment (service variables), CRI's default mounts and capabilities,
// masked paths and the runtime's default seccomp profile.
func criSpec(spec *specs.Spec) {
	for i := range 24 {
		spec.Process.Env = append(spec.Process.Env, fmt.Sprintf("SVC_%02d_SERVICE_HOST=10.96.%d.%d", i, i/8, i%8+10),
			fmt.Sprintf("SVC_%02d_PORT=tcp://10.96.%d.%d:8080", i, i/8, i%8+10))
	}
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	for _, m := range []string{"/proc", "/dev", "/dev/pts", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/etc/hosts", "/dev/termination-log",
		"/etc/hostname", "/etc/resolv.conf", "/dev/shm", "/var/run/secrets/kubernetes.io/serviceaccount"} {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m, Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes" + m,
			Options: []string{"rbind", "rprivate", "ro"}})
	}
	names := make([]string, 0, 330)
	for i := range cap(names) {
		names = append(names, fmt.Sprintf("syscall_%03d", i))
	}
	spec.Linux = &specs.Linux{
		CgroupsPath: "kubepods-besteffort.slice:cri-containerd:seed",
		MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
			"/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/sys/devices/virtual/powercap"},
		ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		Seccomp: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
			Syscalls: []specs.LinuxSyscall{{Names: names, Action: specs.ActAllow}}},
	}
}

// imageConfig is seeded image i's config blob.
func (s Seed) imageConfig(i int) []byte {
	cfg, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Labels: map[string]string{"seed": s.ImageName(i)}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{seedLayerDigest}},
	})
	return cfg
}

// seedLayer is the one layer every seeded image shares.
var (
	seedLayer       = bytes.Repeat([]byte{7}, 1024)
	seedLayerDigest = digest.FromBytes(seedLayer)
)

// SeedRecords writes s's images and containers straight into the daemon's
// content, image and container stores, s.Workers requests at a time.
func (c *Containerd) SeedRecords(t testing.TB, s Seed) {
	t.Helper()
	if s.Workers <= 0 {
		s.Workers = 16
	}
	// Under a lease, as a pull writes: containerd's garbage collector runs
	// every so many writes and would take blobs no image references yet.
	ctx, done, err := c.Client.WithLease(c.Ctx())
	if err != nil {
		t.Fatalf("seed lease: %v", err)
	}
	defer func() { _ = done(c.Ctx()) }()
	cs := c.Client.ContentStore()
	put := func(ctx context.Context, mediaType string, data []byte, labels map[string]string) (ocispec.Descriptor, error) {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		return d, content.WriteBlob(ctx, cs, d.Digest.String(), bytes.NewReader(data), d, content.WithLabels(labels))
	}
	layer, err := put(ctx, ocispec.MediaTypeImageLayer, seedLayer, nil)
	if err != nil {
		t.Fatalf("seed layer: %v", err)
	}
	seedImage := func(ctx context.Context, i int) error {
		var unpacked map[string]string
		if !s.Fetched {
			unpacked = map[string]string{"containerd.io/gc.ref.snapshot.overlayfs": identity.ChainID([]digest.Digest{layer.Digest}).String()}
		}
		cd, err := put(ctx, ocispec.MediaTypeImageConfig, s.imageConfig(i), unpacked)
		if err != nil {
			return err
		}
		mf, _ := json.Marshal(ocispec.Manifest{Versioned: ispecs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			Config: cd, Layers: []ocispec.Descriptor{layer}})
		md, err := put(ctx, ocispec.MediaTypeImageManifest, mf, map[string]string{
			"containerd.io/gc.ref.content.config": cd.Digest.String(), "containerd.io/gc.ref.content.l.0": layer.Digest.String(),
		})
		if err != nil {
			return err
		}
		if !s.CRIManaged {
			_, err = c.Client.ImageService().Create(ctx, images.Image{Name: s.ImageName(i), Target: md})
			return err
		}
		for _, name := range []string{s.ImageName(i), cd.Digest.String()} {
			if _, err := c.Client.ImageService().Create(ctx, images.Image{Name: name, Target: md,
				Labels: map[string]string{"io.cri-containerd.image": "managed"}}); err != nil {
				return err
			}
		}
		return nil
	}
	seedContainer := func(ctx context.Context, i int) error {
		rec, err := s.SeedContainer(i)
		if err != nil {
			return err
		}
		_, err = c.Client.ContainerService().Create(ctx, rec)
		return err
	}
	if err := Parallel(ctx, s.Images, s.Workers, seedImage); err != nil {
		t.Fatalf("seed images: %v", err)
	}
	if err := Parallel(ctx, s.Containers, s.Workers, seedContainer); err != nil {
		t.Fatalf("seed containers: %v", err)
	}
}

// Parallel runs fn(ctx, i) for i in [0, n) on w goroutines and returns the
// first error; after one, the indexes not yet started are skipped.
func Parallel(ctx context.Context, n, w int, fn func(ctx context.Context, i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range max(min(w, n), 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = fmt.Errorf("%d: %w", i, err); cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// SeedCRIExited writes, for each of s's CRI containers, the status
// checkpoint CRI keeps beside its record (exited at finished, code 0), so
// that CRI loads them on the daemon's next start (Restart) as exited
// containers whose task is gone. Without it CRI knows none of the seeded
// containers.
func (c *Containerd) SeedCRIExited(t testing.TB, s Seed, finished time.Time) {
	t.Helper()
	c.SeedCRIStatus(t, s, finished, func(int) CRIStatus { return CRIExited })
}

// CRIStatus is what the status checkpoint of a seeded CRI container makes
// of it when CRI loads it.
type CRIStatus int

const (
	CRINotLoaded CRIStatus = iota // no checkpoint: CRI does not load it
	CRICreated                    // created and never started, as between CreateContainer and StartContainer
	CRIExited                     // exited (at finished, code 0), its task gone
)

// SeedCRIStatus is SeedCRIExited with the status of each CRI container i
// given by status; a checkpoint written before is replaced or removed.
func (c *Containerd) SeedCRIStatus(t testing.TB, s Seed, finished time.Time, status func(i int) CRIStatus) {
	t.Helper()
	// CRI's versioned status: its Status fields inline beside Version.
	checkpoints := map[CRIStatus][]byte{
		CRIExited: fmt.Appendf(nil, `{"Version":"v1","Pid":0,"CreatedAt":%d,"StartedAt":%d,"FinishedAt":%d,"ExitCode":0,"Reason":"Completed"}`,
			finished.Add(-2*time.Second).UnixNano(), finished.Add(-time.Second).UnixNano(), finished.UnixNano()),
		CRICreated: fmt.Appendf(nil, `{"Version":"v1","Pid":0,"CreatedAt":%d,"StartedAt":0,"FinishedAt":0,"ExitCode":0}`,
			finished.Add(-2*time.Second).UnixNano()),
	}
	root := filepath.Join(c.Root, "io.containerd.grpc.v1.cri", "containers")
	for i := 0; i < s.Containers; i += 2 { // the even ones are CRI's
		dir := filepath.Join(root, s.ContainerID(i))
		st := status(i)
		if st == CRINotLoaded {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "status"), checkpoints[st], 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
