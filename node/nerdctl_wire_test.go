package node

// The wiring of Nerdctl into the re-check and the delete: which labels keep
// a dead container, and what the cleanup after a delete reports. The trees
// are those of nerdctl_test.go (FIELD-2026 §5; not made by nerdctl).

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/gc"
)

func TestOwnerKeeps(t *testing.T) {
	f := newNCFixture(t)
	with := func(k, v string) map[string]string {
		l := map[string]string{}
		for key, val := range f.labels {
			l[key] = val
		}
		l[k] = v
		return l
	}
	tests := []struct {
		name     string
		labels   map[string]string
		wantLive gc.Liveness // "" for no *gc.Kept
		wantWhy  string      // a part of Why
	}{
		{name: "plain container", labels: map[string]string{"app": "x"}},
		{name: "nerdctl container in the data root", labels: f.labels},
		{name: "restart policy wants it running", labels: with("containerd.io/restart.status", "running"),
			wantLive: gc.LiveRestartManaged, wantWhy: NerdctlKeepRestartManaged},
		{name: "plain container with a restart policy", labels: map[string]string{"containerd.io/restart.policy": "always"},
			wantLive: gc.LiveRestartManaged, wantWhy: NerdctlKeepRestartManaged},
		{name: "image mounts", labels: with("nerdctl/image-mount-snapshots", `["a"]`),
			wantLive: gc.LiveOwnerState, wantWhy: NerdctlKeepImageMounts},
		{name: "shareable ipc", labels: with("nerdctl/ipc", `{"mode":"shareable"}`),
			wantLive: gc.LiveOwnerState, wantWhy: NerdctlKeepShareableIPC},
		{name: "state dir outside the data root", labels: with("nerdctl/state-dir", filepath.Join(f.outside, ncStore, "containers", ncNS, ncID)),
			wantLive: gc.LiveOwnerState, wantWhy: "is not under the data root"},
		{name: "state dir of another id", labels: with("nerdctl/state-dir", filepath.Join(f.store, "containers", ncNS, ncOtherID)),
			wantLive: gc.LiveOwnerState, wantWhy: "not that of this namespace and id"},
	}
	r := &Runtime{Nerdctl: f.nerdctl()}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := r.ownerKeeps(ncNS, ncID, tc.labels)
			var k *gc.Kept
			if tc.wantLive == "" {
				if err != nil {
					t.Fatalf("kept: %v", err)
				}
				return
			}
			if !errors.As(err, &k) {
				t.Fatalf("error %v, want a *gc.Kept", err)
			}
			if k.Live != tc.wantLive || !strings.Contains(k.Why, tc.wantWhy) {
				t.Errorf("kept %q because %q, want %q because ...%q...", k.Live, k.Why, tc.wantLive, tc.wantWhy)
			}
		})
	}
}

func TestCleanOwner(t *testing.T) {
	t.Run("nerdctl state removed and reported", func(t *testing.T) {
		f := newNCFixture(t)
		before := ncTree(t, f.root)
		r := &Runtime{Nerdctl: f.nerdctl()}
		// A canceled context (the agent stopping right after the delete)
		// does not stop the cleanup: the container is gone.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got := r.cleanOwner(ctx, ncNS, ncID, f.labels)
		want := []string{
			filepath.Join(f.store, "names", ncNS, "web"),
			filepath.Join(f.store, "etchosts", ncNS, ncID),
			filepath.Join(f.store, "containers", ncNS, ncID),
		}
		if got.Owner != "nerdctl" || got.Error != "" || got.NameHeldBy != "" || strings.Join(got.Removed, " ") != strings.Join(want, " ") {
			t.Errorf("cleaned %+v, want owner nerdctl, removed %v", got, want)
		}
		if got.Bytes <= 0 {
			t.Errorf("bytes %d, want the bytes of the files removed", got.Bytes)
		}
		ncSameTree(t, "data root", ncTree(t, f.root), ncWithout(before,
			filepath.Join(ncStore, "names", ncNS, "web"),
			filepath.Join(ncStore, "etchosts", ncNS, ncID),
			filepath.Join(ncStore, "containers", ncNS, ncID)))
	})
	t.Run("not made by nerdctl", func(t *testing.T) {
		f := newNCFixture(t)
		before := ncTree(t, f.root)
		r := &Runtime{Nerdctl: f.nerdctl()}
		if got := r.cleanOwner(context.Background(), ncNS, ncID, map[string]string{"nerdctl/name": "web"}); got.Owner != "" {
			t.Errorf("cleaned %+v for a container without nerdctl/state-dir", got)
		}
		ncSameTree(t, "data root", ncTree(t, f.root), before)
	})
	t.Run("a failure is reported, not returned", func(t *testing.T) {
		f := newNCFixture(t)
		// The data root is configured elsewhere than the labels say
		// (Check refuses before the delete; here the labels changed after).
		r := &Runtime{Nerdctl: Nerdctl{DataRoot: f.outside}}
		got := r.cleanOwner(context.Background(), ncNS, ncID, f.labels)
		if got.Owner != "nerdctl" || len(got.Removed) != 0 || !strings.Contains(got.Error, "does not fit nerdctl's layout") {
			t.Errorf("cleaned %+v, want owner nerdctl, nothing removed, the refusal as its error", got)
		}
	})
}
