package projection

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/events"
)

// heapAlloc returns the live heap after two collections.
func heapAlloc() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// labelValue is the i-th distinct value of n bytes (containerd's limit
// on a label is 4 KiB).
func labelValue(i, n int) string {
	p := fmt.Sprintf("%08d-", i)
	return p + strings.Repeat("v", n-len(p))
}

// TestLabelValuesReleased: distinct values of the image labels gcagent
// keeps read back while their images exist, and are freed with them: a
// label is any client's to set, so nothing may keep its values for the
// life of the process (issue 25, finding 6).
func TestLabelValuesReleased(t *testing.T) {
	const n, size = 20000, 4096
	for _, label := range []string{LabelCRIManaged, LabelPinned} {
		t.Run(label, func(t *testing.T) {
			s := New()
			name := func(i int) string { return fmt.Sprintf("example.test/%s/app-%d:1", label, i) }
			digest := func(i int) string { return fmt.Sprintf("sha256:%s-%064d", label, i) }
			before := heapAlloc()
			for i := range n {
				s.Apply(events.ImageUpserted{At: at(0), Name: name(i), Digest: digest(i), Size: 1,
					Labels: map[string]string{label: labelValue(i, size), "other": "x"}})
			}
			held := heapAlloc() - before
			for i := range n {
				img := s.Images[digest(i)]
				if img == nil {
					t.Fatalf("image %d missing", i)
				}
				l, ok := img.Names.Labels(name(i))
				if !ok || l[label] != labelValue(i, size) || len(l) != 1 {
					t.Fatalf("image %d: labels %.40q (%d), want only %s=%.40q", i, l, len(l), label, labelValue(i, size))
				}
			}
			for i := range n {
				s.Apply(events.ImageDeleted{At: at(1), Name: name(i)})
			}
			if len(s.Images) != 0 {
				t.Fatalf("%d images left", len(s.Images))
			}
			left := heapAlloc() - before
			runtime.KeepAlive(s)
			t.Logf("live heap: %.1f MiB with %d images, %.1f MiB after they are deleted",
				float64(held)/(1<<20), n, float64(left)/(1<<20))
			if limit := int64(n * size / 10); left > limit { // a tenth of the values
				t.Fatalf("live heap still %.1f MiB above where it started after the images are deleted, want under %.1f MiB",
					float64(left)/(1<<20), float64(limit)/(1<<20))
			}
		})
	}
}

// TestLabelSetsShared: images whose labels are as CRI writes them share
// one map per set (the memory win of a busy node's thousands of images);
// any other set is a map of the state's own, with values of its own.
func TestLabelSetsShared(t *testing.T) {
	odd := labelValue(1, 64)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		shared bool
	}{
		{"managed", map[string]string{LabelCRIManaged: "managed", "other": "x"}, true},
		{"pinned", map[string]string{LabelPinned: LabelPinnedValue}, true},
		{"pinned and managed", map[string]string{LabelPinned: LabelPinnedValue, LabelCRIManaged: "managed"}, true},
		{"other managed value", map[string]string{LabelCRIManaged: odd}, false},
		{"other pinned value", map[string]string{LabelPinned: "no", LabelCRIManaged: "managed"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := [2]events.ImageUpserted{}
			for i := range evs {
				l := map[string]string{}
				for k, v := range tc.labels {
					l[k] = fresh(v)
				}
				evs[i] = events.ImageUpserted{At: at(0), Name: fmt.Sprintf("a:%d", i), Digest: fmt.Sprintf("sha256:%d", i), Labels: l}
			}
			s := apply(New(), evs[0], evs[1])
			l0, _ := s.Images["sha256:0"].Names.Labels("a:0")
			l1, _ := s.Images["sha256:1"].Names.Labels("a:1")
			want := events.ImageLabels(tc.labels)
			if fmt.Sprint(l0) != fmt.Sprint(want) || fmt.Sprint(l1) != fmt.Sprint(want) {
				t.Fatalf("labels %v and %v, want %v", l0, l1, want)
			}
			if got := fmt.Sprintf("%p", l0) == fmt.Sprintf("%p", l1); got != tc.shared {
				t.Fatalf("one map for both images: %v, want %v", got, tc.shared)
			}
			for k, v := range l0 {
				if same(v, evs[0].Labels[k]) {
					t.Errorf("%s: the state holds the event's string, not a copy of its own", k)
				}
			}
		})
	}
}
