package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/gcagent/gcagent/deploy"
	"github.com/gcagent/gcagent/internal/testenv"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubeletEnv resolves the container's environment the way the kubelet does:
// the ConfigMap of envFrom first, then env in order, fieldRefs from the
// pod's node, and $(VAR) references to variables defined before.
func kubeletEnv(t *testing.T, m deploy.Manifest, c corev1.Container, fields map[string]string) ([]string, map[string]string) {
	t.Helper()
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil || m.ConfigMap == nil || ef.ConfigMapRef.Name != m.ConfigMap.Name {
			t.Fatalf("envFrom %+v: only the manifest's ConfigMap can be resolved here", ef)
		}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range m.ConfigMap.Data {
				if !yield(k) {
					return
				}
			}
		}) {
			set(k, m.ConfigMap.Data[k])
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, expandRefs(e.Value, vals))
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("env %s: field %s is not emulated", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			set(e.Name, v)
		default:
			t.Fatalf("env %s: only values and fieldRefs are emulated", e.Name)
		}
	}
	return order, vals
}

var refRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandRefs replaces $(VAR) with the value of a variable defined before,
// and leaves unknown references as they are (the kubelet's rule).
func expandRefs(s string, vals map[string]string) string {
	return refRE.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := vals[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// makeShared bind-mounts dir on itself as a shared mount, as systemd makes
// every mount on a node: CRI refuses HostToContainer propagation from a
// private mount. testenv unmounts it with the daemon's directory.
func makeShared(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", dir, err)
	}
}

// procStatus returns the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// TestDaemonSetAsCRIPod: the image `make image` built is imported into a
// private containerd and run as a CRI pod the way a kubelet runs the
// DaemonSet of deploy/kubernetes/gcagent.yaml: its args, its hostPath
// mounts (each host path mapped to the private daemon's), its security
// context and resources, its environment (ConfigMap, fieldRefs, $(VAR)).
// The test overrides only what ties a run to this machine: the metrics port,
// the NATS server, and a policy sized to the measured disk. Inside the
// pod, the agent deletes an image under disk pressure, prunes a dead
// container, removes a dangling log link and publishes each action to NATS;
// its process really runs without capabilities, with no_new_privs and
// seccomp, within the memory the manifest requests.
func TestDaemonSetAsCRIPod(t *testing.T) {
	t.Parallel()
	m, err := deploy.DecodeManifest(deploy.ManifestYAML)
	if err != nil {
		t.Fatal(err)
	}
	spec := m.DaemonSet.Spec.Template.Spec
	ctrSpec, err := m.AgentContainer()
	if err != nil {
		t.Fatal(err)
	}
	if !spec.HostNetwork {
		t.Fatal("the test runs pods on the host network; the DaemonSet must too")
	}
	img := testenv.AgentImage(t)
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "256m"})
		ns := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
		nc := natsConn(t, ns.ClientURL())
		rt, _ := c.CRI(t)
		state := filepath.Join(t.TempDir(), "state")
		if err := os.MkdirAll(state, 0o755); err != nil {
			t.Fatal(err)
		}
		names := c.ImportArchive(t, img.Path)
		if !slices.Contains(names, img.Ref) {
			t.Fatalf("import named %v, want %s", names, img.Ref)
		}
		version := img.Ref[strings.LastIndex(img.Ref, ":")+1:]

		// Workload: the sandbox image, a job image whose container is
		// created now and runs later, then an unused image that pushes the
		// disk over the high threshold.
		c.Import(t, testenv.Pause(c.SandboxImage), testenv.Runnable("example.test/job:1"))
		job := c.CreateNative(t, "dead-job", "example.test/job:1", "sh", "-c", "exit 3")
		u0 := usagePercent(t, c.Root)
		const victim = "example.test/victim:1"
		c.Import(t, testenv.Image{Name: victim, Layers: []testenv.Layer{{Seed: "victim", Size: 24 << 20}}})
		u1 := usagePercent(t, c.Root)
		if u1-u0 < 4 {
			t.Fatalf("the victim image moved usage only from %d%% to %d%%", u0, u1)
		}
		high, low := u1, (u0+u1)/2
		t.Logf("usage %d%% without the victim, %d%% with it: high threshold %d%%, low %d%%", u0, u1, high, low)

		// Host paths of the manifest, mapped to the private daemon's.
		hostOf := map[string]string{
			"/run/containerd/containerd.sock": c.Address,
			"/var/lib/containerd":             c.Root,
			"/var/log/containers":             c.LogDir,
			"/var/log/pods":                   c.PodLogDir,
			"/var/lib/gcagent":                state,
		}
		mounts, hosts, err := m.HostPaths()
		if err != nil {
			t.Fatal(err)
		}
		var criMounts []*runtime.Mount
		for _, vm := range ctrSpec.VolumeMounts {
			local, ok := hostOf[hosts[vm.MountPath]]
			if !ok {
				t.Fatalf("the DaemonSet mounts host path %s, which this test does not map", hosts[vm.MountPath])
			}
			prop := runtime.MountPropagation_PROPAGATION_PRIVATE
			if p := mounts[vm.MountPath].MountPropagation; p != nil {
				switch *p {
				case corev1.MountPropagationHostToContainer:
					prop = runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER
					makeShared(t, local)
				case corev1.MountPropagationBidirectional:
					prop = runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL
				}
			}
			criMounts = append(criMounts, &runtime.Mount{ContainerPath: vm.MountPath, HostPath: local, Readonly: vm.ReadOnly, Propagation: prop})
		}

		order, env := kubeletEnv(t, m, ctrSpec, map[string]string{"spec.nodeName": natsNode, "status.hostIP": "127.0.0.1"})
		if got := env["GCAGENT_METRICS_ADDRESS"]; got != "127.0.0.1:9617" {
			t.Errorf("the manifest's metrics address resolves to %q, want the node's address on 9617", got)
		}
		metricsAddr := testenv.FreeAddr(t)
		overrides := map[string]string{
			"GCAGENT_METRICS_ADDRESS":            metricsAddr, // 9617 may be taken on this machine
			"GCAGENT_NATS_URL":                   ns.ClientURL(),
			"GCAGENT_IMAGE_GC_HIGH_THRESHOLD":    strconv.Itoa(high),
			"GCAGENT_IMAGE_GC_LOW_THRESHOLD":     strconv.Itoa(low),
			"GCAGENT_MINIMUM_IMAGE_TTL_DURATION": "0s",
			"GCAGENT_UNCOLLECTED_EXIT_GRACE":     "1s", // nobody collects the job's exit here
			"GCAGENT_POD_LOG_GRACE":              "1s", // a link of an unknown container waits this long
			// The links name the host's pod log dir, which the pod sees at
			// /var/log/pods: what a chart sets where the host path differs.
			"GCAGENT_HOST_POD_LOG_DIR": c.PodLogDir,
		}
		for k, v := range overrides {
			if _, ok := env[k]; !ok {
				order = append(order, k)
			}
			env[k] = v
		}
		var kvs []*runtime.KeyValue
		for _, k := range order {
			kvs = append(kvs, &runtime.KeyValue{Key: k, Value: []byte(env[k])})
		}
		var args []string
		for _, a := range ctrSpec.Args {
			args = append(args, expandRefs(a, env))
		}

		sc := ctrSpec.SecurityContext
		criSC := &runtime.LinuxContainerSecurityContext{
			Privileged:       sc.Privileged != nil && *sc.Privileged,
			ReadonlyRootfs:   sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem,
			NoNewPrivs:       sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
			NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_CONTAINER},
		}
		if sc.RunAsUser != nil {
			criSC.RunAsUser = &runtime.Int64Value{Value: *sc.RunAsUser}
		}
		if sc.RunAsGroup != nil {
			criSC.RunAsGroup = &runtime.Int64Value{Value: *sc.RunAsGroup}
		}
		if sc.Capabilities != nil {
			criSC.Capabilities = &runtime.Capability{}
			for _, c := range sc.Capabilities.Drop {
				criSC.Capabilities.DropCapabilities = append(criSC.Capabilities.DropCapabilities, string(c))
			}
			for _, c := range sc.Capabilities.Add {
				criSC.Capabilities.AddCapabilities = append(criSC.Capabilities.AddCapabilities, string(c))
			}
		}
		if p := spec.SecurityContext; p != nil && p.SeccompProfile != nil && p.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault {
			criSC.Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
		}
		memLimit := ctrSpec.Resources.Limits.Memory().Value()
		resources := &runtime.LinuxContainerResources{
			CpuShares:          max(2, ctrSpec.Resources.Requests.Cpu().MilliValue()*1024/1000), // the kubelet's MilliCPUToShares
			MemoryLimitInBytes: memLimit,
		}

		pod := c.RunPod(t, rt, m.DaemonSet.Name+"-test", m.DaemonSet.Namespace, "6a1f0c1e-gcagent-daemonset")
		ctx, cancel := context.WithTimeout(c.Ctx(), time.Minute)
		defer cancel()
		created, err := rt.CreateContainer(ctx, &runtime.CreateContainerRequest{
			PodSandboxId: pod.SandboxID,
			Config: &runtime.ContainerConfig{
				Metadata: &runtime.ContainerMetadata{Name: ctrSpec.Name},
				Image:    &runtime.ImageSpec{Image: img.Ref},
				Command:  ctrSpec.Command, // empty: the image's entrypoint, /gcagent
				Args:     args,
				Envs:     kvs,
				Mounts:   criMounts,
				LogPath:  ctrSpec.Name + "/0.log",
				Labels: map[string]string{
					"io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": pod.Namespace,
					"io.kubernetes.pod.uid": pod.UID, "io.kubernetes.container.name": ctrSpec.Name,
				},
				Linux: &runtime.LinuxContainerConfig{Resources: resources, SecurityContext: criSC},
			},
			SandboxConfig: pod.Config,
		})
		if err != nil {
			t.Fatalf("create the agent container: %v\n%s", err, c.LogTail(20))
		}
		agentID := created.ContainerId
		agentLog := filepath.Join(pod.LogDir, ctrSpec.Name, "0.log")
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(agentLog)
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("agent container log tail:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		})
		if _, err := rt.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: agentID}); err != nil {
			t.Fatalf("start the agent container: %v\n%s", err, c.LogTail(20))
		}
		a := &testenv.Agent{Addr: metricsAddr}
		testenv.Eventually(t, 60*time.Second, func() string {
			if code, err := a.Get("/readyz", nil); code != 200 {
				return fmt.Sprintf("agent in the pod not ready: %d %v", code, err)
			}
			return ""
		})

		// Under pressure since its start: the victim goes, nothing else.
		testenv.Eventually(t, 30*time.Second, func() string {
			if !imageGone(t, c, victim) {
				return "victim image still there (usage " + strconv.Itoa(usagePercent(t, c.Root)) + "%)"
			}
			return ""
		})
		for _, keep := range []string{img.Ref, c.SandboxImage, "example.test/job:1"} {
			if imageGone(t, c, keep) {
				t.Errorf("image %s was deleted", keep)
			}
		}

		// A job runs and exits: the agent prunes it.
		task, err := job.NewTask(c.Ctx(), cio.NullIO)
		if err == nil {
			err = task.Start(c.Ctx())
		}
		if err != nil {
			t.Fatalf("start dead-job: %v", err)
		}
		// A link whose target exists on the host, at a path the pod does
		// not see (issue 27): kept, though its container is unknown.
		hostLink := filepath.Join(c.LogDir, "shipper_default_app-fedcba9876543210.log")
		mustSymlink(t, agentLog, hostLink)
		link := danglingLog(t, c, "ghost", "0123456789abcdef")
		testenv.Eventually(t, 30*time.Second, func() string {
			switch {
			case !containerGone(t, c, "dead-job"):
				return "dead-job not pruned"
			case exists(link):
				return "dangling log link still there"
			}
			return ""
		})
		if !exists(hostLink) {
			t.Errorf("the agent in the pod removed %s, whose target exists on the host", hostLink)
		}

		// Each action on NATS, exactly once, with the documented fields.
		var evs []storedEvent
		testenv.Eventually(t, 30*time.Second, func() string {
			evs = readStream(t, nc)
			types := checkTypes(evs)
			if types["image.removed"] < 1 || types["container.removed"] < 1 || types["log.removed"] < 1 {
				return fmt.Sprintf("events so far: %v", types)
			}
			return ""
		})
		checkContract(t, evs)
		var victimRemoved, started bool
		for _, ev := range evs {
			var data struct {
				Names   []string `json:"names"`
				Version string   `json:"version"`
			}
			_ = json.Unmarshal(ev.Data, &data)
			switch ev.KindAction {
			case "image.removed":
				victimRemoved = victimRemoved || slices.Contains(data.Names, victim)
			case "agent.started":
				started = true
				if data.Version != version {
					t.Errorf("agent.started says version %q, the image is %q", data.Version, version)
				}
			case "container.removed":
				if ev.Subject != "dead-job" {
					t.Errorf("container.removed for %s", ev.Subject)
				}
			}
		}
		if !victimRemoved || !started {
			t.Errorf("victim image.removed %v, agent.started %v", victimRemoved, started)
		}

		// The process really runs as the manifest says, within its memory.
		st, err := rt.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: agentID, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State != runtime.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("agent container %s", st.Status.State)
		}
		var info struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
			t.Fatalf("agent pid from CRI: %v %s", err, st.Info["info"])
		}
		ps := procStatus(t, info.Pid)
		for k, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0"} {
			if ps[k] != want {
				t.Errorf("agent process %s = %q, want %q", k, ps[k], want)
			}
		}
		text, err := metricsText(a)
		if err != nil {
			t.Fatal(err)
		}
		rss := metricSum(text, "process_resident_memory_bytes")
		stats, err := rt.ContainerStats(ctx, &runtime.ContainerStatsRequest{ContainerId: agentID})
		if err != nil {
			t.Fatal(err)
		}
		ws := int64(stats.Stats.GetMemory().GetWorkingSetBytes().GetValue())
		req := ctrSpec.Resources.Requests.Memory().Value()
		t.Logf("containerd %s: agent in the pod: RSS %.1f MiB, working set %.1f MiB (request %d MiB, limit %d MiB), %d events",
			v, rss/(1<<20), float64(ws)/(1<<20), req>>20, memLimit>>20, len(evs))
		if rss <= 0 || int64(rss) > memLimit/2 {
			t.Errorf("RSS %.0f bytes: the limit %d should leave at least half as headroom", rss, memLimit)
		}
		if ws > memLimit {
			t.Errorf("working set %d above the limit %d", ws, memLimit)
		}
	})
}
