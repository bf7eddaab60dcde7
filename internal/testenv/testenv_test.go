package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestArchiveIsDeterministicAndSharesLayers(t *testing.T) {
	base := Layer{Seed: "base", Size: 1 << 10}
	var a, b bytes.Buffer
	imgs := []Image{
		{Name: "example.test/a:1", Layers: []Layer{base, {Seed: "a", Size: 10}}},
		{Name: "example.test/b:1", Layers: []Layer{base, {Seed: "b", Size: 10}}},
	}
	if err := Archive(&a, imgs...); err != nil {
		t.Fatal(err)
	}
	if err := Archive(&b, imgs...); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("archives of the same images differ")
	}
	// The shared base layer is stored once: 3 layer files, not 4.
	tr := tar.NewReader(&a)
	layers := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(h.Name, "/layer.tar") {
			layers++
		}
	}
	if layers != 3 {
		t.Fatalf("archive holds %d layers, want 3", layers)
	}
}

// TestDaemons proves the harness on every daemon: images with a shared base,
// a native container, and a CRI pod driven like a kubelet.
func TestDaemons(t *testing.T) {
	for _, v := range Versions() {
		t.Run(string(v), func(t *testing.T) {
			c := StartContainerd(t, Options{Version: v, RootSize: "128m"})
			ctx, cancel := context.WithTimeout(c.Ctx(), 2*time.Minute)
			defer cancel()
			ver, err := c.Client.Version(ctx)
			if err != nil || !strings.HasPrefix(strings.TrimPrefix(ver.Version, "v"), string(v)) {
				t.Fatalf("version %q, %v", ver.Version, err)
			}
			recs := c.Import(t, Runnable("example.test/app:1", Layer{Seed: "app", Size: 1 << 20}), Pause(c.SandboxImage))
			if len(recs) != 2 {
				t.Fatalf("imported %d images", len(recs))
			}
			ctr := c.RunNative(t, "native-"+string(v[0]), "example.test/app:1", "sh", "-c", "exit 3")
			c.WaitExit(t, ctr)
			task, err := ctr.Task(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			st, err := task.Status(ctx)
			if err != nil || st.ExitStatus != 3 {
				t.Fatalf("exit status %d, %v", st.ExitStatus, err)
			}
			c.DeleteNative(t, ctr)

			rt, _ := c.CRI(t)
			pod := c.RunPod(t, rt, "web", "default", "uid-"+string(v[0]))
			id := c.RunPodContainer(t, rt, pod, "app", "example.test/app:1", "sh", "-c", "echo hello; sleep 60")
			resp, err := rt.ListContainers(ctx, &runtime.ListContainersRequest{})
			if err != nil || len(resp.Containers) != 1 || resp.Containers[0].Id != id {
				t.Fatalf("CRI containers: %v, %v", resp, err)
			}
		})
	}
}
