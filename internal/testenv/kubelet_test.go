package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// TestKubeletVersionMatchesBuild: the kubelet (and kube-apiserver and
// kubectl) the harness looks for is the one `make deps` builds, from the module that requires it, with every
// staging module replaced by the tag of the same release.
func TestKubeletVersionMatchesBuild(t *testing.T) {
	gomod, err := os.ReadFile(filepath.Join("k8sbuild", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes ` + regexp.QuoteMeta(KubeletVersion) + `\b`).Match(gomod) {
		t.Errorf("k8sbuild/go.mod does not require k8s.io/kubernetes %s", KubeletVersion)
	}
	for _, cmd := range []string{"kubelet", "kube-apiserver", "kubectl"} {
		if !regexp.MustCompile(`(?m)^(tool |\t)k8s\.io/kubernetes/cmd/` + regexp.QuoteMeta(cmd) + `$`).Match(gomod) {
			t.Errorf("k8sbuild/go.mod has no tool k8s.io/kubernetes/cmd/%s", cmd)
		}
	}
	staging := "v0" + strings.TrimPrefix(KubeletVersion, "v1")
	replaces := regexp.MustCompile(`(?m)^\s*(k8s\.io/[a-z-]+) => k8s\.io/[a-z-]+ (v\S+)$`).FindAllSubmatch(gomod, -1)
	if len(replaces) < 20 {
		t.Errorf("k8sbuild/go.mod replaces %d staging modules; k8s.io/kubernetes has over 20", len(replaces))
	}
	for _, r := range replaces {
		if string(r[2]) != staging {
			t.Errorf("k8sbuild/go.mod: %s => %s, want %s", r[1], r[2], staging)
		}
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "\nKUBELET_VERSION := "+KubeletVersion+"\n") {
		t.Errorf("the Makefile's KUBELET_VERSION is not %s", KubeletVersion)
	}
}

// TestKubeletConfigFromOptions: the options reach the configuration file
// (zero ones leave the kubelet's defaults), Edit comes last, and a rewrite
// is a new file, read back as written.
func TestKubeletConfigFromOptions(t *testing.T) {
	dir := t.TempDir()
	c := &Containerd{Address: filepath.Join(dir, "c.sock"), PodLogDir: filepath.Join(dir, "pods")}
	k := &Kubelet{Containerd: c, Dir: dir, StaticPodDir: filepath.Join(dir, "manifests"), CgroupRoot: "/gcak-test",
		Addr: "127.0.0.1:10250", HealthzAddr: "127.0.0.1:10248", ConfigPath: filepath.Join(dir, "config.yaml"), t: t}
	cfg := k.config(KubeletOptions{
		SyncFrequency: 10 * time.Second, ImageGCHighThresholdPercent: 70, ImageGCLowThresholdPercent: 20,
		ImageMinimumGCAge: time.Minute,
		Edit:              func(cfg *kubeletv1beta1.KubeletConfiguration) { cfg.ImageGCLowThresholdPercent = nil },
	})
	k.WriteConfig(t, cfg)
	var before unix.Stat_t
	if err := unix.Stat(k.ConfigPath, &before); err != nil {
		t.Fatal(err)
	}
	got := k.Config(t)
	if got.ContainerRuntimeEndpoint != "unix://"+c.Address || got.PodLogsDir != c.PodLogDir || got.StaticPodPath != k.StaticPodDir ||
		got.CgroupRoot != "/gcak-test" || got.Address != "127.0.0.1" || got.Port != 10250 || *got.HealthzPort != 10248 {
		t.Errorf("paths and addresses: %+v", got)
	}
	if got.SyncFrequency.Duration != 10*time.Second || *got.ImageGCHighThresholdPercent != 70 || got.ImageGCLowThresholdPercent != nil ||
		got.ImageMinimumGCAge.Duration != time.Minute || got.ImageMaximumGCAge.Duration != 0 {
		t.Errorf("options: sync %v, high %v, low %v (Edit cleared it), min age %v, max age %v",
			got.SyncFrequency, got.ImageGCHighThresholdPercent, got.ImageGCLowThresholdPercent, got.ImageMinimumGCAge, got.ImageMaximumGCAge)
	}
	if !*got.Authentication.Anonymous.Enabled || *got.Authentication.Webhook.Enabled || got.Authorization.Mode != "AlwaysAllow" ||
		*got.CgroupsPerQOS || *got.FailCgroupV1 || *got.FailSwapOn || *got.RegisterNode || !slices.Equal(got.EnforceNodeAllocatable, []string{"none"}) {
		t.Errorf("what this machine needs: %+v", got)
	}
	k.EditConfig(t, func(cfg *kubeletv1beta1.KubeletConfiguration) {
		off := int32(100)
		cfg.ImageGCHighThresholdPercent = &off
	})
	var after unix.Stat_t
	if err := unix.Stat(k.ConfigPath, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino == before.Ino {
		t.Error("EditConfig wrote the file in place; want a new inode, as editors and kubeadm do")
	}
	if got := k.Config(t); *got.ImageGCHighThresholdPercent != 100 || got.SyncFrequency.Duration != 10*time.Second {
		t.Errorf("after EditConfig: high %v, sync %v", *got.ImageGCHighThresholdPercent, got.SyncFrequency)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files beside the config: %v", ents)
	}
}
