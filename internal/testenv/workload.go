package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunNative creates a plain containerd container (no CRI labels, like
// `ctr run`) from image and starts args in it. It returns the container.
func (c *Containerd) RunNative(t testing.TB, id, image string, args ...string) client.Container {
	t.Helper()
	ctr := c.CreateNative(t, id, image, args...)
	ctx := c.Ctx()
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	return ctr
}

// CreateNative creates a plain container without starting a task.
func (c *Containerd) CreateNative(t testing.TB, id, image string, args ...string) client.Container {
	t.Helper()
	ctx := c.Ctx()
	img, err := c.Client.GetImage(ctx, image)
	if err != nil {
		t.Fatalf("image %s: %v", image, err)
	}
	// runc's state dir and the cgroup are per daemon: by default both are
	// named by namespace and id only, so two tests (or two engineers' runs)
	// on one machine that use the same id collide ("container with given ID
	// already exists"), or one's delete kills the other's cgroup.
	ctr, err := c.Client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithNewSnapshot(id, img),
		client.WithRuntime("io.containerd.runc.v2", &runcoptions.Options{Root: filepath.Join(c.Dir, "runc")}),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...), oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithCgroup("/"+filepath.Base(c.Dir)+"/"+id)),
	)
	if err != nil {
		t.Fatalf("container %s: %v", id, err)
	}
	return ctr
}

// WaitExit waits until the container's task has exited.
func (c *Containerd) WaitExit(t testing.TB, ctr client.Container) {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.Ctx(), 30*time.Second)
	defer cancel()
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatalf("task of %s: %v", ctr.ID(), err)
	}
	st, err := task.Status(ctx)
	if err == nil && st.Status == client.Stopped {
		return
	}
	ch, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %s: %v", ctr.ID(), err)
	}
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("%s did not exit", ctr.ID())
	}
}

// StopNative kills the task (if any) and waits for the exit; it keeps the
// stopped task, as a crashed container would.
func (c *Containerd) StopNative(t testing.TB, ctr client.Container) {
	t.Helper()
	ctx := c.Ctx()
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return
	}
	ch, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %s: %v", ctr.ID(), err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", ctr.ID(), err)
	}
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not die", ctr.ID())
	}
}

// DeleteNative deletes the task and the container with its snapshot.
func (c *Containerd) DeleteNative(t testing.TB, ctr client.Container) {
	t.Helper()
	ctx := c.Ctx()
	if task, err := ctr.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
			t.Fatalf("delete task %s: %v", ctr.ID(), err)
		}
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("delete %s: %v", ctr.ID(), err)
	}
}

// CRI returns CRI clients on the daemon's socket.
func (c *Containerd) CRI(t testing.TB) (runtime.RuntimeServiceClient, runtime.ImageServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("cri dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return runtime.NewRuntimeServiceClient(conn), runtime.NewImageServiceClient(conn)
}

// Pod is a CRI pod created like a kubelet would.
type Pod struct {
	UID, Name, Namespace, SandboxID string
	LogDir                          string // the pod's dir under PodLogDir
	Config                          *runtime.PodSandboxConfig
}

// RunPod runs a pod sandbox with host networking (no CNI needed) and the
// kubelet's labels and log directory. The sandbox image must be imported.
func (c *Containerd) RunPod(t testing.TB, rt runtime.RuntimeServiceClient, name, namespace, uid string) *Pod {
	t.Helper()
	p := &Pod{UID: uid, Name: name, Namespace: namespace, LogDir: filepath.Join(c.PodLogDir, namespace+"_"+name+"_"+uid)}
	if err := os.MkdirAll(p.LogDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.Config = &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		LogDirectory: p.LogDir,
		Labels: map[string]string{
			"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": uid,
		},
		Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE},
		}},
	}
	ctx, cancel := context.WithTimeout(c.Ctx(), time.Minute)
	defer cancel()
	resp, err := rt.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: p.Config})
	if err != nil {
		t.Fatalf("run pod %s: %v\n%s", name, err, c.LogTail(20))
	}
	p.SandboxID = resp.PodSandboxId
	return p
}

// RunPodContainer creates and starts a container in the pod with the
// kubelet's labels, and links its log into LogDir as the kubelet does.
func (c *Containerd) RunPodContainer(t testing.TB, rt runtime.RuntimeServiceClient, p *Pod, name, image string, args ...string) string {
	t.Helper()
	return c.RunPodContainerAttempt(t, rt, p, name, 0, image, args...)
}

// RunPodContainerAttempt is RunPodContainer for restart number attempt: CRI
// reserves name+attempt per pod, as the kubelet's restarts use them.
func (c *Containerd) RunPodContainerAttempt(t testing.TB, rt runtime.RuntimeServiceClient, p *Pod, name string, attempt uint32, image string, args ...string) string {
	t.Helper()
	return c.runPodContainer(t, rt, p, name, attempt, image, nil, args)
}

// RunPodContainerMounts is RunPodContainer with mounts, such as OCI image
// volumes (a Mount whose Image is set; containerd 2.1+).
func (c *Containerd) RunPodContainerMounts(t testing.TB, rt runtime.RuntimeServiceClient, p *Pod, name, image string, mounts []*runtime.Mount, args ...string) string {
	t.Helper()
	return c.runPodContainer(t, rt, p, name, 0, image, mounts, args)
}

func (c *Containerd) runPodContainer(t testing.TB, rt runtime.RuntimeServiceClient, p *Pod, name string, attempt uint32, image string, mounts []*runtime.Mount, args []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.Ctx(), time.Minute)
	defer cancel()
	logPath := filepath.Join(name, fmt.Sprintf("%d.log", attempt))
	resp, err := rt.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: p.SandboxID,
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: name, Attempt: attempt},
			Image:    &runtime.ImageSpec{Image: image},
			Command:  args,
			Mounts:   mounts,
			LogPath:  logPath,
			Labels: map[string]string{
				"io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": p.Namespace,
				"io.kubernetes.pod.uid": p.UID, "io.kubernetes.container.name": name,
			},
		},
		SandboxConfig: p.Config,
	})
	if err != nil {
		t.Fatalf("create container %s attempt %d: %v\n%s", name, attempt, err, c.LogTail(20))
	}
	id := resp.ContainerId
	if _, err := rt.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("start container %s attempt %d: %v\n%s", name, attempt, err, c.LogTail(20))
	}
	link := filepath.Join(c.LogDir, fmt.Sprintf("%s_%s_%s-%s.log", p.Name, p.Namespace, name, id))
	if err := os.Symlink(filepath.Join(p.LogDir, logPath), link); err != nil {
		t.Fatal(err)
	}
	return id
}
