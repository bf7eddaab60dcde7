package testenv

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// StaticPod returns a static pod for a standalone kubelet: namespace
// "default", host network (there is no CNI), DNS from the host, a grace
// period of one second, and ImagePullPolicy Never for every container that
// does not set one (there is no registry: import the images first).
func StaticPod(name string, containers ...corev1.Container) *corev1.Pod {
	grace := int64(1)
	for i := range containers {
		if containers[i].ImagePullPolicy == "" {
			containers[i].ImagePullPolicy = corev1.PullNever
		}
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    containers,
		},
	}
}

// PutStaticPod writes manifest (any YAML or JSON the kubelet reads) as the
// static pod file name.yaml, replacing the one of that name atomically:
// the kubelet sees the new pod, or the pod changed, at once (inotify).
func (k *Kubelet) PutStaticPod(t testing.TB, name string, manifest []byte) {
	t.Helper()
	writeRenamed(t, k.manifestPath(name), manifest)
}

// PutPod is PutStaticPod of pod, under its own name.
func (k *Kubelet) PutPod(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	b, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	k.PutStaticPod(t, pod.Name, b)
}

// RemoveStaticPod removes the static pod file name.yaml: the kubelet
// kills the pod (its containers stay until its container GC).
func (k *Kubelet) RemoveStaticPod(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(k.manifestPath(name)); err != nil {
		t.Fatal(err)
	}
}

func (k *Kubelet) manifestPath(name string) string {
	return filepath.Join(k.StaticPodDir, name+".yaml")
}

// StaticPodName is the name the kubelet gives the static pod whose
// manifest says name (and CRI's pod name, in its labels and log dirs).
func (k *Kubelet) StaticPodName(name string) string { return name + "-" + k.NodeName }

// Get sends GET path to the kubelet's API (anonymous, AlwaysAllow) and
// returns its status and body.
func (k *Kubelet) Get(path string) (int, []byte, error) {
	resp, err := k.http.Get("https://" + k.Addr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Pods returns the kubelet's /pods: every pod it runs, with the status of
// static pods as its status manager has it (restarts, lastState).
func (k *Kubelet) Pods(t testing.TB) []corev1.Pod {
	t.Helper()
	code, b, err := k.Get("/pods")
	if err != nil || code != http.StatusOK {
		t.Fatalf("kubelet /pods: %d %v %.200s", code, err, b)
	}
	var list corev1.PodList
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("kubelet /pods: %v", err)
	}
	return list.Items
}

// Pod returns the static pod whose manifest says namespace/name from
// /pods, if the kubelet has it.
func (k *Kubelet) Pod(t testing.TB, namespace, name string) (*corev1.Pod, bool) {
	t.Helper()
	for _, p := range k.Pods(t) {
		if p.Namespace == namespace && p.Name == k.StaticPodName(name) {
			return &p, true
		}
	}
	return nil, false
}

// WaitPod waits up to within until cond, given the static pod's state from
// /pods, returns "" (else what it waits for), and returns that pod.
func (k *Kubelet) WaitPod(t testing.TB, namespace, name string, within time.Duration, cond func(*corev1.Pod) string) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	// Pod states change on the kubelet's scale of a second: ask 5 times one.
	EventuallyEvery(t, within, 200*time.Millisecond, func() string {
		p, ok := k.Pod(t, namespace, name)
		if !ok {
			return fmt.Sprintf("pod %s/%s not in the kubelet's /pods", namespace, k.StaticPodName(name))
		}
		last = p
		if why := cond(p); why != "" {
			return fmt.Sprintf("pod %s/%s: %s", namespace, p.Name, why)
		}
		return ""
	})
	return last
}

// ContainerStatus returns the status of the pod's container named name.
func ContainerStatus(p *corev1.Pod, name string) (corev1.ContainerStatus, bool) {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name {
			return s, true
		}
	}
	return corev1.ContainerStatus{}, false
}

// ContainerLogs is the kubelet's /containerLogs of the static pod whose
// manifest says namespace/name (what `kubectl logs [--previous]` reads):
// its HTTP status and body.
func (k *Kubelet) ContainerLogs(t testing.TB, namespace, name, container string, previous bool) (int, string) {
	t.Helper()
	path := fmt.Sprintf("/containerLogs/%s/%s/%s", url.PathEscape(namespace), url.PathEscape(k.StaticPodName(name)), url.PathEscape(container))
	if previous {
		path += "?previous=true"
	}
	code, b, err := k.Get(path)
	if err != nil {
		t.Fatalf("kubelet %s: %v", path, err)
	}
	return code, string(b)
}
