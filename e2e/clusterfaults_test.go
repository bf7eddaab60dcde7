package e2e

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/natsbus"
)

// TestClusterKeepListNATSLosesItsStore (issue 41's review): the fleet's
// NATS restarts without its store (no persistent volume, a store lost)
// while an agent is under lasting disk pressure, on containerd 1.6 and
// 2.3. The CronJob's image survives: the agent, finding no list, keeps the
// last complete one for its grace; the component makes the bucket again
// and writes the list whole, which the agent reads as complete again; an
// image no workload names still goes. Before, the component's writes
// failed for as long as it led (its compare-and-set on a head that no
// longer existed, a bucket it did not make again) and the agent, finding
// no list, deleted the CronJob's image at once.
func TestClusterKeepListNATSLosesItsStore(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		api := testenv.StartAPIServer(t, testenv.APIServerOptions{Users: []testenv.APIUser{testenv.ClusterUser()}})
		e := &clusterEnv{api: api, admin: kubernetes.NewForConfigOrDie(api.Config(testenv.AdminUser)), name: "e2e"}
		e.role = testenv.ApplyClusterRBAC(t, api)
		_, portText, _ := net.SplitHostPort(testenv.FreeAddr(t))
		port, _ := strconv.Atoi(portText)
		srv := testenv.StartNATS(t, testenv.NATSOptions{JetStream: true, Port: port})
		e.url = srv.ClientURL()
		connect := func() {
			nc, err := nats.Connect(e.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			e.js, _ = jetstream.New(nc)
			e.kv = nil
		}
		connect()
		ctx := context.Background()
		_, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "batch"}}, metav1.CreateOptions{})
		mustCreate(t, err)
		_, err = e.admin.BatchV1().CronJobs("batch").Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "report"},
			Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", Suspend: ptr.To(true),
				JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: podSpec(corev1.RestartPolicyOnFailure, "example.test/report:7")}}}},
			metav1.CreateOptions{})
		mustCreate(t, err)
		e.start(t, "replica-a", "--leader-election=false") // the default grace, 1h
		whole := func() string {
			if l := e.list(t); !l.Whole() || !slices.Equal(l.Patterns(), []string{"example.test/report:7"}) {
				return "cluster key: " + describeList(l)
			}
			return ""
		}
		testenv.Eventually(t, 2*time.Minute, whole)

		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		report := testenv.Image{Name: "example.test/report:7", Layers: []testenv.Layer{{Seed: "lost-report", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "lost-filler", Size: 3 << 20}}}
		c.Import(t, report, filler)
		a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--nats-url", e.url, "--cluster", e.name,
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s")
		natsWaitSynced(t, a)
		testenv.Eventually(t, time.Minute, func() string {
			if !imageGone(t, c, filler.Name) {
				return "the filler image, which no workload names, is still there"
			}
			return ""
		})
		if imageGone(t, c, report.Name) {
			t.Fatal("report:7 deleted although the CronJob declares it")
		}

		// NATS restarts on the same port with an empty store.
		srv.Shutdown()
		srv.WaitForShutdown()
		testenv.StartNATS(t, testenv.NATSOptions{JetStream: true, Port: port})
		connect()
		testenv.Eventually(t, 2*time.Minute, whole)
		st, err := e.js.Stream(ctx, "KV_"+natsbus.KeepBucket)
		if err != nil {
			t.Fatal(err)
		}
		if mb := st.CachedInfo().Config.MaxBytes; mb < 64<<20 {
			t.Errorf("the bucket made again holds %d bytes, the cluster list needs 64 MiB", mb)
		}
		testenv.Eventually(t, 3*time.Minute, func() string {
			if m := mustMetrics(t, a); metricSum(m, `gcagent_keep_list_cluster_state{state="complete"}`) != 1 {
				return "the agent's cluster list:\n" + grepLines(m, "gcagent_keep_list_cluster_state")
			}
			return ""
		})
		if imageGone(t, c, report.Name) {
			t.Fatal("report:7 deleted while NATS came back without its store")
		}
		// Image GC went on meanwhile: an image no workload names goes.
		filler2 := testenv.Image{Name: "example.test/filler:2", Layers: []testenv.Layer{{Seed: "lost-filler-2", Size: 3 << 20}}}
		// Under one lease, as ctr and a pull import: the agent, with no
		// minimum age, may take the image the moment it is made, and
		// its content then goes before the unpack.
		c.ImportLeased(t, filler2)
		// A pass while the lease held it skipped it (in-flight-pull), and
		// a lease's end is no event: the next pass is the retry, a minute
		// (image GC's Retry) after that one.
		testenv.Eventually(t, 2*time.Minute, func() string {
			if !imageGone(t, c, filler2.Name) {
				return "filler:2 still there: " + keptBy(a, filler2.Name)
			}
			return ""
		})
		if imageGone(t, c, report.Name) || keptBy(a, report.Name) != "keep-pattern cluster keep list: "+report.Name+", declared by CronJob/batch/report" {
			t.Fatalf("report:7 at the end: %s", keptBy(a, report.Name))
		}
	})
}
