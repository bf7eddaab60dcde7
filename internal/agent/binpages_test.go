package agent

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestPageOutBinary: the executable's read-only pages are paged out (the
// file-backed RSS falls), and the process goes on running its code.
func TestPageOutBinary(t *testing.T) {
	before, after, err := pageOutBinary()
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 || after >= before {
		t.Fatalf("file-backed RSS %d -> %d bytes, want it lower", before, after)
	}
	t.Logf("file-backed RSS %d -> %d KiB", before>>10, after>>10)
	if got := strings.Repeat("ok", 2); got != "okok" { // code paged out runs again
		t.Fatal(got)
	}
}

// TestOneProcessor: one processor once started, unless GOMAXPROCS says.
func TestOneProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	t.Setenv("GOMAXPROCS", "3")
	if before, changed := oneProcessor(); changed || before != 4 || runtime.GOMAXPROCS(0) != 4 {
		t.Fatalf("GOMAXPROCS set: %d, changed %v, now %d", before, changed, runtime.GOMAXPROCS(0))
	}
	os.Unsetenv("GOMAXPROCS")
	if before, changed := oneProcessor(); !changed || before != 4 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("GOMAXPROCS unset: %d, changed %v, now %d", before, changed, runtime.GOMAXPROCS(0))
	}
}
