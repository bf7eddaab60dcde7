package testenv

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestAPIServerHasRBAC: the harness's API server authenticates by token and
// authorizes by RBAC: the admin may do anything, a service account's
// identity nothing it was not granted, and kubectl talks to it.
func TestAPIServerHasRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	sa := ServiceAccountUser("gcagent", "gcagent-cluster")
	api := StartAPIServer(t, APIServerOptions{Users: []APIUser{sa}})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(api.Config(AdminUser))
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin: %v", err)
	}
	comp := kubernetes.NewForConfigOrDie(api.Config(sa.Name))
	_, err := comp.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a service account without a binding lists pods: %v", err)
	}
	out, err := api.Kubectl(AdminUser, "get", "namespace", "shop", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "namespace/shop" {
		t.Fatalf("kubectl: %q %v", out, err)
	}
}
