package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestClusterViewOnTheNode (issue 41): a real API server, the component
// with the chart's RBAC, NATS, and an agent under lasting disk pressure on
// containerd 1.6 and 2.3. The image of a suspended CronJob (no job runs on
// the node) and of a Deployment scaled to zero survive while an image no
// workload names goes, and plan says which workload keeps each; the
// removal shows as an Event on the agent's Node, read back through the
// API; the Deployment deleted, its image is released after the grace and
// the next pass deletes it; the component stopped, the agent says the
// list is stale and keeps the CronJob's image.
func TestClusterViewOnTheNode(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		e := startClusterEnv(t)
		ctx := context.Background()
		for _, ns := range []string{"batch", "shop"} {
			_, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			mustCreate(t, err)
		}
		_, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "test-node"}}, metav1.CreateOptions{})
		mustCreate(t, err)
		_, err = e.admin.BatchV1().CronJobs("batch").Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "report"},
			Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", Suspend: ptr.To(true),
				JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: podSpec(corev1.RestartPolicyOnFailure, "example.test/report:7")}}}},
			metav1.CreateOptions{})
		mustCreate(t, err)
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
		_, err = e.admin.AppsV1().Deployments("shop").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: podSpec(corev1.RestartPolicyAlways, "example.test/web:2")}},
			metav1.CreateOptions{})
		mustCreate(t, err)
		comp := e.start(t, "replica-a", "--release-after", "5s", "--leader-election=false")
		testenv.Eventually(t, 2*time.Minute, func() string {
			if l := e.list(t); !l.Whole() || !slices.Equal(l.Patterns(), []string{"example.test/report:7", "example.test/web:2"}) {
				return "cluster key: " + describeList(l)
			}
			return ""
		})

		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		report := testenv.Image{Name: "example.test/report:7", Layers: []testenv.Layer{{Seed: "cluster-report", Size: 2 << 20}}}
		web := testenv.Image{Name: "example.test/web:2", Layers: []testenv.Layer{{Seed: "cluster-web", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "cluster-filler", Size: 3 << 20}}}
		c.Import(t, report, web, filler)
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--nats-url", e.url, "--cluster", e.name,
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s")
		natsWaitSynced(t, a)
		testenv.Eventually(t, time.Minute, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image, which no workload names, is still there"
			}
			return ""
		})
		for name, by := range map[string]string{report.Name: "CronJob/batch/report", web.Name: "Deployment/shop/web"} {
			if imageGone(t, c, name) {
				t.Fatalf("%s deleted although %s declares it", name, by)
			}
			if got := keptBy(a, name); got != "keep-pattern cluster keep list: "+name+", declared by "+by {
				t.Errorf("%s: plan says %q", name, got)
			}
		}
		// The removal on the node, on its Node object.
		testenv.Eventually(t, time.Minute, func() string {
			l, err := e.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=test-node"})
			if err != nil {
				return err.Error()
			}
			for _, ev := range l.Items {
				if ev.Reason == "ImageRemoved" && strings.Contains(ev.Message, filler.Name) {
					return ""
				}
			}
			return "no ImageRemoved event for the filler on Node test-node"
		})

		// The Deployment goes: its image is released after the 5 s grace,
		// and the pressure that lasts deletes it.
		deleted := time.Now() // before the call: the component may see it go before its answer
		mustCreate(t, e.admin.AppsV1().Deployments("shop").Delete(ctx, "web", metav1.DeleteOptions{}))
		testenv.Eventually(t, 2*time.Minute, func() string {
			if !imageGone(t, c, web.Name) {
				return "web:2 still there: " + keptBy(a, web.Name)
			}
			return ""
		})
		if held := time.Since(deleted); held < 5*time.Second {
			t.Fatalf("web:2 deleted %s after its Deployment went, within the grace", held)
		}
		if imageGone(t, c, report.Name) {
			t.Fatal("the CronJob's image went with the Deployment's")
		}

		// The component stops: the agent says the list is stale and keeps
		// by the last one.
		comp.Kill()
		testenv.Eventually(t, time.Minute, func() string {
			_, body, _ := a.GetText("/readyz")
			if !strings.Contains(body, "has not said it is alive") {
				return "readyz: " + body
			}
			return ""
		})
		m := mustMetrics(t, a)
		if metricSum(m, `gcagent_keep_list_state{state="stale"}`) != 1 || metricSum(m, `gcagent_keep_list_cluster_state{state="stale"}`) != 1 {
			t.Errorf("metrics:\n%s", grepLines(m, "gcagent_keep_list"))
		}
		if imageGone(t, c, report.Name) || !strings.HasPrefix(keptBy(a, report.Name), "keep-pattern cluster keep list: ") {
			t.Fatalf("with the component stopped, report:7: %s", keptBy(a, report.Name))
		}
	})
}
