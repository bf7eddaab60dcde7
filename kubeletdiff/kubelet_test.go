package kubeletdiff

import (
	"context"
	"flag"
	"io"
	"slices"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	critest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	containertest "k8s.io/kubernetes/pkg/kubelet/container/testing"
	"k8s.io/kubernetes/pkg/kubelet/kuberuntime"
	"k8s.io/kubernetes/pkg/kubelet/logs"
	proberesults "k8s.io/kubernetes/pkg/kubelet/prober/results"
)

// pods is the kubelet's pod state provider (its pod workers): a deleted
// pod of the world is one the API server no longer has, terminated.
type pods struct{ deleted map[types.UID]bool }

func (p *pods) IsPodTerminationRequested(uid types.UID) bool { return p.deleted[uid] }
func (p *pods) ShouldPodRuntimeBeRemoved(uid types.UID) bool { return p.deleted[uid] }
func (p *pods) ShouldPodContentBeRemoved(uid types.UID) bool { return p.deleted[uid] }

// kubelet is the kubelet's real container runtime manager
// (kuberuntime.NewKubeGenericRuntimeManager, the constructor the kubelet
// itself calls) over CRI's fake runtime service. The package's own
// newFakeKubeRuntimeManager is unexported (a test helper of that package);
// this is the exported entry point with the same fakes it uses: a stub
// container manager, a stub log manager and a fake OS. GarbageCollect is
// the kubelet's containerGC.GarbageCollect, unchanged.
type kubelet struct {
	cri     *critest.FakeRuntimeService
	pods    *pods
	runtime kuberuntime.KubeGenericRuntime
}

func newKubelet(t *testing.T) *kubelet {
	t.Helper()
	// The kubelet logs every removal through klog's global logger.
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(io.Discard)
	ctx := klog.NewContext(context.Background(), klog.Background().V(10)) // V(10): quiet at the default verbosity
	k := &kubelet{cri: critest.NewFakeRuntimeService(), pods: &pods{deleted: map[types.UID]bool{}}}
	rt, _, err := kuberuntime.NewKubeGenericRuntimeManager(ctx,
		record.NewFakeRecorder(1000), proberesults.NewManager(), proberesults.NewManager(), proberesults.NewManager(),
		t.TempDir(), "/var/log/pods", &cadvisorapi.MachineInfo{}, k.pods, 110,
		&containertest.FakeOS{}, &containertest.FakeRuntimeHelper{}, nil,
		flowcontrol.NewBackOff(time.Second, 300*time.Second), false, nil, 0, 0, "NeverVerify", nil, "", "",
		nil, false, metav1.Duration{Duration: 100 * time.Millisecond}, nil,
		k.cri, critest.NewFakeImageService(), cm.NewStubContainerManager(), logs.NewStubContainerLogManager(),
		nil, false, "", nil, nil, "", nil, noop.NewTracerProvider(), nil, nil, nil)
	if err != nil {
		t.Fatalf("kubelet runtime manager: %v", err)
	}
	k.runtime = rt
	return k
}

// decide loads w into the fake CRI, runs the kubelet's container GC once
// (all pod sources ready, as on a running kubelet; not the eviction
// path), and returns what it removed.
func (k *kubelet) decide(ctx context.Context, w *world) (removed []string, err error) {
	var sandboxes []*critest.FakePodSandbox
	var containers []*critest.FakeContainer
	clear(k.pods.deleted)
	for _, pd := range w.pods {
		k.pods.deleted[types.UID(pd.uid)] = pd.deleted
		for _, sb := range pd.sandboxes {
			st := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
			if sb.ready {
				st = runtimeapi.PodSandboxState_SANDBOX_READY
			}
			sandboxes = append(sandboxes, &critest.FakePodSandbox{PodSandboxStatus: runtimeapi.PodSandboxStatus{
				Id:        sb.id,
				Metadata:  &runtimeapi.PodSandboxMetadata{Name: pd.name, Uid: pd.uid, Namespace: pd.namespace},
				State:     st,
				CreatedAt: sb.created.UnixNano(),
				Labels:    map[string]string{"io.kubernetes.pod.uid": pd.uid, "io.kubernetes.pod.name": pd.name, "io.kubernetes.pod.namespace": pd.namespace},
			}})
		}
		for _, c := range pd.containers {
			st := map[state]runtimeapi.ContainerState{
				running: runtimeapi.ContainerState_CONTAINER_RUNNING, exited: runtimeapi.ContainerState_CONTAINER_EXITED,
				neverStarted: runtimeapi.ContainerState_CONTAINER_CREATED,
			}[c.state]
			var finished int64
			if !c.exited.IsZero() {
				finished = c.exited.UnixNano()
			}
			containers = append(containers, &critest.FakeContainer{SandboxID: c.sandbox, ContainerStatus: runtimeapi.ContainerStatus{
				Id:         c.id,
				Metadata:   &runtimeapi.ContainerMetadata{Name: c.name, Attempt: uint32(c.attempt)},
				State:      st,
				CreatedAt:  c.created.UnixNano(),
				FinishedAt: finished,
				Image:      &runtimeapi.ImageSpec{Image: "app:1"},
				Labels: map[string]string{"io.kubernetes.pod.uid": pd.uid, "io.kubernetes.pod.name": pd.name,
					"io.kubernetes.pod.namespace": pd.namespace, "io.kubernetes.container.name": c.name},
			}})
		}
	}
	k.cri.SetFakeSandboxes(sandboxes)
	k.cri.SetFakeContainers(containers)
	policy := kubecontainer.GCPolicy{MinAge: w.minAge, MaxPerPodContainer: w.maxPer, MaxContainers: w.maxAll}
	if err := k.runtime.GarbageCollect(ctx, policy, true, false); err != nil {
		return nil, err
	}
	k.cri.Lock()
	defer k.cri.Unlock()
	for _, sb := range sandboxes {
		if _, ok := k.cri.Sandboxes[sb.Id]; !ok {
			removed = append(removed, sb.Id)
		}
	}
	for _, c := range containers {
		if _, ok := k.cri.Containers[c.Id]; !ok {
			removed = append(removed, c.Id)
		}
	}
	slices.Sort(removed)
	return removed, nil
}
