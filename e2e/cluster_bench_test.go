package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
)

func benchEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkClusterFirstSync: a real API server holding
// GCAGENT_BENCH_WORKLOADS (10,000) workloads in 100 namespaces (a sixth each
// Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs and CronJobs,
// each naming images of its own) and GCAGENT_BENCH_PODS (50,000) pods; then
// gcagent-cluster starts, with the chart's RBAC. It reports the time from
// its start to its first complete list on NATS holding every image
// (first-sync-s), its peak and final resident memory (rss-peak-MiB,
// rss-MiB), and what setting the cluster up took (setup-s).
func BenchmarkClusterFirstSync(b *testing.B) {
	workloads := benchEnvInt("GCAGENT_BENCH_WORKLOADS", 10_000)
	pods := benchEnvInt("GCAGENT_BENCH_PODS", 50_000)
	for range b.N {
		runClusterFirstSync(b, workloads, pods)
	}
}

func runClusterFirstSync(b *testing.B, workloads, pods int) {
	api := testenv.StartAPIServer(b, testenv.APIServerOptions{Users: []testenv.APIUser{testenv.ClusterUser()},
		// The set-up's 60,000 creates would otherwise queue behind the
		// defaults meant for a shared control plane.
		Args: []string{"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"}})
	testenv.ApplyClusterRBAC(b, api)
	cfg := api.Config(testenv.AdminUser)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	admin := kubernetes.NewForConfigOrDie(cfg)
	srv := testenv.StartNATS(b, testenv.NATSOptions{JetStream: true})
	ctx := context.Background()

	start := time.Now()
	const namespaces = 100
	for i := range namespaces {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%03d", i)}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	tmpl := func(restart corev1.RestartPolicy, image string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
			Spec: corev1.PodSpec{RestartPolicy: restart, Containers: []corev1.Container{{Name: "app", Image: image,
				Env: []corev1.EnvVar{{Name: "MODE", Value: "production"}}, Args: []string{"--port=8080", "--verbose"}}}}}
	}
	var created atomic.Int64
	parallel(b, workloads, func(i int) error {
		ns, name := fmt.Sprintf("ns-%03d", i%namespaces), fmt.Sprintf("w-%05d", i)
		image := fmt.Sprintf("registry.example.com/team-%03d/service-%05d:v1.%d", i%namespaces, i, i%7)
		var err error
		switch i % 6 {
		case 0:
			_, err = admin.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: tmpl(corev1.RestartPolicyAlways, image)}}, metav1.CreateOptions{})
		case 1:
			_, err = admin.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: tmpl(corev1.RestartPolicyAlways, image)}}, metav1.CreateOptions{})
		case 2:
			_, err = admin.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0), Selector: sel, Template: tmpl(corev1.RestartPolicyAlways, image)}}, metav1.CreateOptions{})
		case 3:
			_, err = admin.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: appsv1.DaemonSetSpec{Selector: sel, Template: tmpl(corev1.RestartPolicyAlways, image)}}, metav1.CreateOptions{})
		case 4:
			_, err = admin.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: tmpl(corev1.RestartPolicyNever, image)}}, metav1.CreateOptions{})
		default:
			_, err = admin.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", Suspend: ptr.To(true),
					JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl(corev1.RestartPolicyNever, image)}}}}, metav1.CreateOptions{})
		}
		created.Add(1)
		return err
	})
	// Pods name the workloads' images (as they would), a fifth an image of
	// their own.
	parallel(b, pods, func(i int) error {
		ns := fmt.Sprintf("ns-%03d", i%namespaces)
		w := i % workloads
		image := fmt.Sprintf("registry.example.com/team-%03d/service-%05d:v1.%d", w%namespaces, w, w%7)
		if i%5 == 0 {
			image = fmt.Sprintf("registry.example.com/adhoc/pod-%05d:latest", i)
		}
		spec := tmpl(corev1.RestartPolicyAlways, image).Spec
		_, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i),
			Labels: map[string]string{"app": "x", "pod-template-hash": "abc"}}, Spec: spec}, metav1.CreateOptions{})
		return err
	})
	setup := time.Since(start)
	wantImages := workloads + (pods+4)/5

	c := testenv.StartCluster(b, api, "bench", "--nats-url", srv.ClientURL(), "--cluster", "bench", "--leader-election=false", "--events=false",
		"--profiling")
	t0 := time.Now()
	nc := mustNATS(b, srv.ClientURL())
	js, _ := jetstream.New(nc)
	var synced time.Duration
	var peak int64
	for synced == 0 {
		if m, err := testenv.ReadProcMemory(c.Pid()); err == nil {
			peak = max(peak, m.Peak)
		}
		if h := readHead(ctx, js, "bench"); h != nil && h.State == "complete" && h.Images >= wantImages {
			synced = time.Since(t0)
			break
		}
		if time.Since(t0) > 5*time.Minute {
			b.Fatalf("no complete list of %d images after 5m:\n%s", wantImages, c.LogTail(10))
		}
		time.Sleep(50 * time.Millisecond)
	}
	m, _ := testenv.ReadProcMemory(c.Pid())
	peak = max(peak, m.Peak)
	if dir := os.Getenv("GCAGENT_BENCH_PROFILE_DIR"); dir != "" {
		// The heap after the first sync, for go tool pprof.
		if resp, err := http.Get("http://" + c.Addr + "/debug/pprof/heap"); err == nil {
			f, _ := os.Create(filepath.Join(dir, "cluster-heap.pb.gz"))
			_, _ = io.Copy(f, resp.Body)
			f.Close()
			resp.Body.Close()
		}
	}
	b.ReportMetric(synced.Seconds(), "first-sync-s")
	b.ReportMetric(float64(peak)/(1<<20), "rss-peak-MiB")
	b.ReportMetric(float64(m.RSS)/(1<<20), "rss-MiB")
	b.ReportMetric(setup.Seconds(), "setup-s")
	b.Logf("%d workloads and %d pods (%d distinct images): first complete list %.2f s after the start; RSS peak %.1f MiB, now %.1f MiB; set-up %.0f s",
		workloads, pods, wantImages, synced.Seconds(), float64(peak)/(1<<20), float64(m.RSS)/(1<<20), setup.Seconds())
}

// headView is what the bench reads of the cluster key's head.
type headView struct {
	State  string `json:"state"`
	Images int    `json:"images"`
}

func readHead(ctx context.Context, js jetstream.JetStream, cluster string) *headView {
	kv, err := js.KeyValue(ctx, natsbus.KeepBucket)
	if err != nil {
		return nil
	}
	e, err := kv.Get(ctx, "declared."+cluster+".head")
	if err != nil {
		return nil
	}
	var h headView
	if json.Unmarshal(e.Value(), &h) != nil {
		return nil
	}
	return &h
}

// parallel runs f(0..n-1) on 32 goroutines and fails on the first error.
func parallel(b *testing.B, n int, f func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	var next atomic.Int64
	var first atomic.Value
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || first.Load() != nil {
					return
				}
				if err := f(i); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		b.Fatal(err)
	}
}

func mustNATS(tb testing.TB, url string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}
