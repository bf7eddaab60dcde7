package agent

import (
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
