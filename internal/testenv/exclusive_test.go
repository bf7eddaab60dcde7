package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestExclusiveOneHolderAtATime: two parallel tests take the same name;
// their holds do not overlap.
func TestExclusiveOneHolderAtATime(t *testing.T) {
	name := fmt.Sprintf("selftest-%d", os.Getpid())
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	t.Run("holders", func(t *testing.T) {
		for _, h := range []string{"a", "b"} {
			t.Run(h, func(t *testing.T) {
				t.Parallel()
				Exclusive(t, name, 10*time.Second)
				note("start")
				time.Sleep(100 * time.Millisecond) // the hold itself: the other must wait it out
				note("end")
			})
		}
	})
	if want := []string{"start", "end", "start", "end"}; !slices.Equal(order, want) {
		t.Fatalf("holds %v, want %v: they overlapped", order, want)
	}
	os.Remove(filepath.Join(os.TempDir(), "gcagent-test-"+name+".lock"))
}
