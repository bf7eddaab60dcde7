package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	clusterkeep "github.com/gcagent/gcagent/declared"
	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
)

// clusterEnv is a real API server with the component's RBAC applied, a
// NATS server, and clients of both.
type clusterEnv struct {
	api   *testenv.APIServer
	admin kubernetes.Interface
	role  *rbacv1.ClusterRole
	url   string
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	name  string // the cluster's name in NATS
}

func startClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	api := testenv.StartAPIServer(t, testenv.APIServerOptions{Users: []testenv.APIUser{testenv.ClusterUser()}})
	e := &clusterEnv{api: api, admin: kubernetes.NewForConfigOrDie(api.Config(testenv.AdminUser)), name: "e2e"}
	e.role = testenv.ApplyClusterRBAC(t, api)
	srv := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true})
	e.url = srv.ClientURL()
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.js, _ = jetstream.New(nc)
	return e
}

// start runs one replica of the component against the environment.
func (e *clusterEnv) start(t *testing.T, identity string, extra ...string) *testenv.Cluster {
	t.Helper()
	return testenv.StartCluster(t, e.api, identity, append([]string{"--nats-url", e.url, "--cluster", e.name, "--heartbeat", "1s",
		"--log-format", "json"}, extra...)...)
}

// list reads the cluster key as an agent does.
func (e *clusterEnv) list(t *testing.T) clusterkeep.List {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.kv == nil {
		kv, err := e.js.KeyValue(ctx, natsbus.KeepBucket)
		if err != nil {
			return clusterkeep.List{}
		}
		e.kv = kv
	}
	he, err := e.kv.Get(ctx, clusterkeep.HeadKey(e.name))
	if err != nil {
		return clusterkeep.List{}
	}
	h, err := clusterkeep.DecodeHead(he.Value())
	if err != nil {
		t.Fatalf("head: %v", err)
	}
	shards := map[string]clusterkeep.Shard{}
	for i := range h.Shards {
		key := clusterkeep.ShardKey(e.name, h.Shards, i)
		se, err := e.kv.Get(ctx, key)
		if err != nil {
			continue
		}
		s, err := clusterkeep.DecodeShard(se.Value())
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		shards[key] = s
	}
	return clusterkeep.Assemble(e.name, &h, shards)
}

// podSpec is a template with a container per image; restart is the
// restart policy (Deployments take only Always, Jobs only OnFailure or
// Never).
func podSpec(restart corev1.RestartPolicy, images ...string) corev1.PodTemplateSpec {
	var s corev1.PodSpec
	for i, im := range images {
		s.Containers = append(s.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: im})
	}
	s.RestartPolicy = restart
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}}, Spec: s}
}

func mustCreate(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func describeList(l clusterkeep.List) string {
	if l.Head == nil {
		return "no head"
	}
	var imgs []string
	for _, im := range l.Images {
		imgs = append(imgs, im.Ref+" ["+strings.Join(im.By, ",")+"]")
	}
	return fmt.Sprintf("%s (%s) by %s, %d shards, %d missing: %s", l.Head.State, l.Head.Reason, l.Head.By, l.Head.Shards, l.Missing, strings.Join(imgs, "; "))
}

func (l clusterListView) has(ref string) bool {
	return slices.Contains(clusterkeep.List(l).Patterns(), ref)
}

type clusterListView clusterkeep.List

// TestClusterKeepSync: the component, with exactly the chart's RBAC rules
// against a real API server, publishes the images a suspended CronJob, a
// Deployment scaled to zero and the ReplicaSet a rollback would use
// declare, each with its workloads; one of two replicas leads; an image a
// workload stops naming stays for the grace, then goes; the other replica
// takes over when the leader dies, and keeps the grace; with the rule for
// one kind taken away, the list is never published as complete and keeps
// what the last complete list held.
func TestClusterKeepSync(t *testing.T) {
	t.Parallel()
	e := startClusterEnv(t)
	ctx := context.Background()
	for _, ns := range []string{"batch", "shop"} {
		_, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		mustCreate(t, err)
	}
	_, err := e.admin.BatchV1().CronJobs("batch").Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "report"},
		Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", Suspend: ptr.To(true),
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: podSpec(corev1.RestartPolicyOnFailure, "report:7")}}}}, metav1.CreateOptions{})
	mustCreate(t, err)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	_, err = e.admin.AppsV1().Deployments("shop").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: podSpec(corev1.RestartPolicyAlways, "app:2")}}, metav1.CreateOptions{})
	mustCreate(t, err)
	// The ReplicaSet of the previous revision (no controller manager runs:
	// the test makes what a rollout leaves).
	_, err = e.admin.AppsV1().ReplicaSets("shop").Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1"},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: podSpec(corev1.RestartPolicyAlways, "app:1", "sidecar@sha256:"+strings.Repeat("ab", 32))}}, metav1.CreateOptions{})
	mustCreate(t, err)

	a := e.start(t, "replica-a", "--release-after", "4s")
	b := e.start(t, "replica-b", "--release-after", "4s")
	want := []string{"docker.io/library/app:1", "docker.io/library/app:2", "docker.io/library/report:7",
		"docker.io/library/sidecar@sha256:" + strings.Repeat("ab", 32)}
	var l clusterkeep.List
	testenv.Eventually(t, 2*time.Minute, func() string {
		l = e.list(t)
		if !l.Whole() || !slices.Equal(l.Patterns(), want) {
			return "cluster key: " + describeList(l)
		}
		return ""
	})
	if got := l.Sources("docker.io/library/report:7"); got != "CronJob/batch/report" {
		t.Errorf("report:7 declared by %q", got)
	}
	if got := l.Sources("docker.io/library/app:2"); got != "Deployment/shop/web" {
		t.Errorf("app:2 declared by %q", got)
	}
	leader := l.Head.By
	if leader != "replica-a" && leader != "replica-b" {
		t.Fatalf("head written by %q", leader)
	}
	leaders := 0
	for _, c := range []*testenv.Cluster{a, b} {
		if strings.Contains(c.Metrics(), "\ngcagent_cluster_leader 1\n") {
			leaders++
		}
		// The standby syncs its own informers, maybe later than the leader.
		testenv.Eventually(t, time.Minute, func() string {
			if code, body := c.Readyz(); code != 200 || !strings.Contains(body, "keep list: complete") {
				return fmt.Sprintf("readyz %d: %s", code, body)
			}
			return ""
		})
	}
	if leaders != 1 {
		t.Fatalf("%d replicas lead", leaders)
	}

	// The rollback's ReplicaSet goes (out of the history): its images wait
	// out the grace, then go.
	// Taken before the call: the component may see the workload go (its
	// watch) before the call's answer reaches the test.
	deleted := time.Now()
	mustCreate(t, e.admin.AppsV1().ReplicaSets("shop").Delete(ctx, "web-1", metav1.DeleteOptions{}))
	testenv.Eventually(t, time.Minute, func() string {
		l = e.list(t)
		if clusterListView(l).has("docker.io/library/app:1") {
			if !strings.Contains(l.Sources("docker.io/library/app:1"), "no workload since") {
				return "app:1 still declared: " + describeList(l)
			}
			return "app:1 waiting out its grace"
		}
		return ""
	})
	if held := time.Since(deleted); held < 4*time.Second {
		t.Fatalf("app:1 released %s after its workload went, within the 4s grace", held)
	}
	if !clusterListView(l).has("docker.io/library/app:2") || !l.Whole() {
		t.Fatalf("after the release: %s", describeList(l))
	}

	// The leader dies: the other replica takes over and publishes the same list.
	other := b
	if leader == "replica-b" {
		a, other = b, a
	}
	a.Kill()
	testenv.Eventually(t, 2*time.Minute, func() string {
		l = e.list(t)
		if l.Head == nil || l.Head.By == leader || !l.Whole() {
			return "after the leader died: " + describeList(l)
		}
		return ""
	})
	if !slices.Equal(l.Patterns(), []string{"docker.io/library/app:2", "docker.io/library/report:7"}) {
		t.Fatalf("the new leader's list: %s", describeList(l))
	}

	// Take the rule for cronjobs away: the component restarted cannot read
	// them, and never says the list is complete; the CronJob's image stays.
	role := e.role.DeepCopy()
	for i := range role.Rules {
		role.Rules[i].Resources = slices.DeleteFunc(role.Rules[i].Resources, func(r string) bool { return r == "cronjobs" })
	}
	_, err = e.admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
	mustCreate(t, err)
	other.Kill()
	c := e.start(t, "replica-c", "--release-after", "4s", "--leader-election=false")
	testenv.Eventually(t, 2*time.Minute, func() string {
		l = e.list(t)
		if l.Head == nil || l.Head.By != "replica-c" || l.Head.State != clusterkeep.Incomplete {
			return "without the cronjobs rule: " + describeList(l)
		}
		return ""
	})
	if !strings.Contains(l.Head.Reason, "cronjobs") || !clusterListView(l).has("docker.io/library/report:7") {
		t.Fatalf("incomplete list: %s", describeList(l))
	}
	// Heartbeats go on past the 4 s grace (by the component's own clock),
	// and the list stays incomplete and keeps the image throughout.
	since := l.Head.Since
	testenv.Eventually(t, time.Minute, func() string {
		l = e.list(t)
		if l.Head.State != clusterkeep.Incomplete || !clusterListView(l).has("docker.io/library/report:7") {
			t.Fatalf("while incomplete: %s", describeList(l))
		}
		if d := l.Head.Heartbeat.Sub(since); d < 6*time.Second {
			return fmt.Sprintf("incomplete for %s", d)
		}
		return ""
	})
	if code, body := c.Readyz(); !strings.Contains(body, "cronjobs: cannot read") {
		t.Errorf("readyz %d: %s", code, body)
	}
}

// TestClusterEventsOnNodes: an agent's removal published to the fleet's
// stream appears as an Event on its Node (events.k8s.io/v1, read back
// through the API and by kubectl describe node); a burst of a thousand
// removals is a few Events with counts, and a pass's summary gets through
// after it.
func TestClusterEventsOnNodes(t *testing.T) {
	t.Parallel()
	e := startClusterEnv(t)
	ctx := context.Background()
	_, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	mustCreate(t, err)
	_, err = e.js.CreateStream(ctx, jetstream.StreamConfig{Name: natsbus.DefaultStream, Subjects: []string{natsbus.EventPrefix + ".>"}})
	mustCreate(t, err)
	c := e.start(t, "replica-a", "--leader-election=false")
	testenv.Eventually(t, 2*time.Minute, func() string {
		if !strings.Contains(c.LogTail(50), "bridging the agents' actions") {
			return "bridge not started:\n" + c.LogTail(5)
		}
		return ""
	})
	publish := func(kind, action, key string, data any) {
		t.Helper()
		ev, err := natsbus.NewEvent(e.name, "node-a", natsbus.Action{Kind: kind, Action: action, Key: key, Subject: key, Data: data}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(ev)
		if _, err := e.js.Publish(ctx, natsbus.Subject(e.name, "node-a", kind, action), b); err != nil {
			t.Fatal(err)
		}
	}
	img := func(i int) map[string]any {
		return map[string]any{"namespace": "k8s.io", "digest": fmt.Sprintf("sha256:%064x", i), "names": []string{fmt.Sprintf("docker.io/library/app:%d", i)},
			"bytes": 100 << 20, "freedBytes": 110 << 20, "rule": "space", "action": "removed", "reason": "space"}
	}
	publish("image", "removed", "one", img(0))
	events := func() []corev1.Event {
		l, err := e.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=node-a"})
		if err != nil {
			return nil
		}
		return l.Items
	}
	testenv.Eventually(t, time.Minute, func() string {
		for _, ev := range events() {
			if ev.Reason == "ImageRemoved" && strings.Contains(ev.Message, "docker.io/library/app:0") && strings.Contains(ev.Message, "110.0 MiB freed") {
				return ""
			}
		}
		return fmt.Sprintf("no ImageRemoved event on node-a: %d events", len(events()))
	})
	// The same Event through events.k8s.io/v1, as written.
	ne, err := e.admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	mustCreate(t, err)
	if len(ne.Items) == 0 || ne.Items[0].ReportingController != "gcagent.io/gcagent" || ne.Items[0].Action != "RemoveImage" || ne.Items[0].Regarding.Name != "node-a" {
		t.Fatalf("events.k8s.io/v1: %+v", ne.Items)
	}

	// A burst of a thousand removals, then a pass's summary.
	for i := 1; i <= 1000; i++ {
		publish("image", "removed", fmt.Sprintf("burst-%d", i), img(i))
	}
	publish("gc", "completed", "pass-1", map[string]any{"trigger": "disk", "usage": 95, "usageAfter": 79, "removed": 1001, "freedBytes": int64(110<<20) * 1001})
	testenv.Eventually(t, 2*time.Minute, func() string {
		for _, ev := range events() {
			if ev.Reason == "ImageGCCompleted" && strings.Contains(ev.Message, "removed 1001 images") {
				return ""
			}
		}
		return "no pass summary"
	})
	var removals, count int32
	for _, ev := range events() {
		if ev.Reason == "ImageRemoved" {
			removals++
			if ev.Series != nil {
				count = max(count, ev.Series.Count)
			}
		}
	}
	if removals > 30 || count < 2 {
		t.Fatalf("a burst of 1000 removals became %d ImageRemoved events (highest count %d)", removals, count)
	}
	t.Logf("1001 removals: %d ImageRemoved events, highest count %d", removals, count)
	out, err := e.api.Kubectl(testenv.AdminUser, "describe", "node", "node-a")
	if err != nil || !strings.Contains(out, "ImageGCCompleted") || !strings.Contains(out, "ImageRemoved") {
		t.Fatalf("kubectl describe node: %v\n%s", err, out)
	}
	var m string
	testenv.Eventually(t, 30*time.Second, func() string {
		m = c.Metrics()
		if !strings.Contains(m, `gcagent_cluster_events_recorded_total{reason="ImageRemoved"} 1001`) {
			return "metrics: " + grepLines(m, "gcagent_cluster_events")
		}
		return ""
	})
}
