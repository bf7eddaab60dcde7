package kubeletconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func kubeletYAML(high, low int) string {
	return fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+
		"imageGCHighThresholdPercent: %d\nimageGCLowThresholdPercent: %d\n", high, low)
}

// renameOver writes b to a new file beside path and renames it over path,
// as editors, kubeadm and configuration management do (a new inode).
func renameOver(t *testing.T, path, b string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".config.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFilePoll: in a real directory, Poll reads the file at first, then
// only when it changed: renamed over (the case a single-file mount
// misses), written in place, removed (reported once), back, invalid, and
// a symlink's target swapped as a ConfigMap volume does.
func TestFilePoll(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(kubeletYAML(70, 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &File{Path: path}
	type want struct {
		changed bool
		high    int    // 0: no settings
		err     string // part of the error; "" none
	}
	poll := func(step string, w want) {
		t.Helper()
		s, changed, err := f.Poll()
		high := 0
		if s != nil {
			high = s.HighThreshold
		}
		switch {
		case changed != w.changed:
			t.Fatalf("%s: changed %v, want %v", step, changed, w.changed)
		case high != w.high:
			t.Fatalf("%s: high threshold %d, want %d (err %v)", step, high, w.high, err)
		case w.err == "" && err != nil:
			t.Fatalf("%s: %v", step, err)
		case w.err != "" && (err == nil || !strings.Contains(err.Error(), w.err)):
			t.Fatalf("%s: err %v, want one saying %q", step, err, w.err)
		}
	}
	poll("first", want{changed: true, high: 70})
	poll("unchanged", want{})

	renameOver(t, path, kubeletYAML(100, 20))
	poll("renamed over", want{changed: true, high: 100})
	poll("unchanged after the rename", want{})

	if err := os.WriteFile(path, []byte(kubeletYAML(90, 80)+"imageMinimumGCAge: 5m0s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	poll("written in place", want{changed: true, high: 90})

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, _, err := f.Poll()
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("removed: err %v, want fs.ErrNotExist", err)
	}
	poll("still absent: said once", want{})

	renameOver(t, path, kubeletYAML(85, 80))
	poll("back", want{changed: true, high: 85})

	renameOver(t, path, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 170\n")
	poll("invalid", want{changed: true, err: "must be between 0 and 100"})
	poll("still invalid: said once", want{})

	// A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data ->
	// ..v1; an update makes ..v2 and swaps the ..data link.
	cm := t.TempDir()
	for v, high := range map[string]int{"..v1": 80, "..v2": 60} {
		if err := os.Mkdir(filepath.Join(cm, v), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cm, v, "config.yaml"), []byte(kubeletYAML(high, 50)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustLink := func(target, link string) {
		t.Helper()
		tmp := link + ".tmp"
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, link); err != nil {
			t.Fatal(err)
		}
	}
	mustLink("..v1", filepath.Join(cm, "..data"))
	mustLink("..data/config.yaml", filepath.Join(cm, "config.yaml"))
	f = &File{Path: filepath.Join(cm, "config.yaml")}
	poll("configmap", want{changed: true, high: 80})
	poll("configmap unchanged", want{})
	mustLink("..v2", filepath.Join(cm, "..data"))
	poll("configmap swapped", want{changed: true, high: 60})
}
