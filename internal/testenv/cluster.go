package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

var (
	clusterBuildOnce sync.Once
	clusterBin       string
	clusterBuildErr  error
)

// ClusterBinary builds cmd/gcagent-cluster once per test process and
// returns its path.
func ClusterBinary(t testing.TB) string {
	t.Helper()
	clusterBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gcagent-cluster-bin-")
		if err != nil {
			clusterBuildErr = err
			return
		}
		clusterBin = filepath.Join(dir, "gcagent-cluster")
		out, err := exec.Command("go", "build", "-tags", ShippedTags, "-o", clusterBin, "github.com/gcagent/gcagent/cmd/gcagent-cluster").CombinedOutput()
		if err != nil {
			clusterBuildErr = fmt.Errorf("go build cmd/gcagent-cluster: %v\n%s", err, out)
		}
	})
	if clusterBuildErr != nil {
		t.Fatal(clusterBuildErr)
	}
	return clusterBin
}

// ClusterManifest is the component's manifest, the chart rendered with the
// component on (the RBAC rules it runs with in the tests).
const ClusterManifest = "deploy/kubernetes/gcagent-cluster.yaml"

// ClusterNamespace and ClusterServiceAccount are where the manifest puts
// the component and who it runs as.
const (
	ClusterNamespace      = "kube-system"
	ClusterServiceAccount = "gcagent-cluster"
)

// ClusterUser is the identity of the component's service account.
func ClusterUser() APIUser { return ServiceAccountUser(ClusterNamespace, ClusterServiceAccount) }

// ApplyClusterRBAC creates, as the admin, the ServiceAccount, roles and
// bindings of the component's manifest (ClusterManifest): exactly the
// chart's rules. It returns the ClusterRole, for a test to take a rule
// away (UpdateClusterRole).
func ApplyClusterRBAC(t testing.TB, api *APIServer) *rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(t), ClusterManifest))
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(api.Config(AdminUser))
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ClusterNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(strings.Join(nonComments(doc), "")) == "" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", ClusterManifest, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			role, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			continue // the Deployment, its Service: nothing runs them here
		}
		if err != nil {
			t.Fatalf("apply %T of %s: %v", obj, ClusterManifest, err)
		}
	}
	if role == nil {
		t.Fatalf("%s has no ClusterRole", ClusterManifest)
	}
	return role
}

// nonComments returns the lines of doc that are not comments.
func nonComments(doc string) []string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return out
}

// Cluster is a running gcagent-cluster.
type Cluster struct {
	Addr    string // its /metrics, /healthz, /readyz
	LogFile string
	t       testing.TB
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartCluster runs gcagent-cluster as the component's service account
// (ClusterUser, which the API server must know) against api, with args
// (--nats-url and the rest); it is killed when the test ends.
func StartCluster(t testing.TB, api *APIServer, identity string, args ...string) *Cluster {
	t.Helper()
	c := &Cluster{Addr: FreeAddr(t), t: t}
	dir := t.TempDir()
	c.LogFile = filepath.Join(dir, "gcagent-cluster-"+identity+".log")
	logf, err := os.Create(c.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(ClusterBinary(t), append([]string{"--kubeconfig", api.Kubeconfig(ClusterUser().Name),
		"--metrics-address", c.Addr, "--identity", identity, "--lease-namespace", ClusterNamespace}, args...)...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	c.done = make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("gcagent-cluster %s log tail:\n%s", identity, tail(c.LogFile, 30))
		}
	})
	return c
}

// Pid is the component's process id.
func (c *Cluster) Pid() int { return c.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the process to end.
func (c *Cluster) Kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Stop sends SIGTERM and waits for the process to end.
func (c *Cluster) Stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.t.Errorf("gcagent-cluster did not stop on SIGTERM")
		c.Kill()
	}
}

// LogTail returns the last n lines the component logged.
func (c *Cluster) LogTail(n int) string { return tail(c.LogFile, n) }

// Readyz returns the status and body of /readyz.
func (c *Cluster) Readyz() (int, string) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + c.Addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// Metrics returns the text of /metrics.
func (c *Cluster) Metrics() string {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + c.Addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
