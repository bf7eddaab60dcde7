package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStateID: the state dir's id is the same at every start, and another
// one in a copy of the state dir (which would otherwise claim a live
// agent's lock as its own last run).
func TestStateID(t *testing.T) {
	dir := t.TempDir()
	id, err := stateID(dir)
	if err != nil || id == "" {
		t.Fatalf("stateID: %q %v", id, err)
	}
	if again, err := stateID(dir); err != nil || again != id {
		t.Errorf("second start: %q %v, want %q", again, err, id)
	}
	copyDir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(dir, stateIDFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(copyDir, stateIDFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if copied, err := stateID(copyDir); err != nil || copied == id {
		t.Errorf("a copy of the state dir: %q %v, want another id than %q", copied, err, id)
	}
}
