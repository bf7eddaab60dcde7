package node

import (
	"slices"
	"testing"
)

func TestSandboxImagesFromConfig(t *testing.T) {
	tests := []struct {
		name, config string
		want         []string
	}{
		{"containerd 1.6", `{"containerd":{"snapshotter":"overlayfs"},"sandboxImage":"registry.k8s.io/pause:3.6","maxConcurrentDownloads":3}`,
			[]string{"registry.k8s.io/pause:3.6"}},
		{"pinned images map", `{"imageConfig":{"pinnedImages":{"sandbox":"registry.k8s.io/pause:3.10","other":"x/y:1"}}}`,
			[]string{"registry.k8s.io/pause:3.10", "x/y:1"}},
		{"snake case", `{"sandbox_image":"p:1","pinned_images":{"sandbox":"p:1"}}`, []string{"p:1"}},
		{"containerd 2.3 runtime config: none", `{"containerd":{"defaultRuntimeName":"runc"},"enableCDI":true}`, nil},
		{"not json", `{`, nil},
		{"empty", ``, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sandboxImagesFromConfig(tt.config); !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
