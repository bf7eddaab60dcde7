package projection

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"

	berrors "go.etcd.io/bbolt/errors"
)

func TestHolderIn(t *testing.T) {
	locks := `1: POSIX  ADVISORY  WRITE 77 fd:00:42 0 EOF
2: FLOCK  ADVISORY  WRITE 4321 08:11:5678 0 EOF
2: -> FLOCK  ADVISORY  READ  999 08:11:5678 0 EOF
3: FLOCK  ADVISORY  WRITE 55 08:11:9999 0 EOF
`
	for _, tc := range []struct {
		name         string
		major, minor uint32
		ino          uint64
		self, want   int
	}{
		{"holder", 8, 0x11, 5678, 1, 4321},
		{"hex device", 0xfd, 0, 42, 1, 77},
		{"other inode", 8, 0x11, 1, 1, 0},
		{"other device", 8, 1, 5678, 1, 0},
		{"self is no holder", 8, 0x11, 5678, 4321, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := holderIn(strings.NewReader(locks), tc.major, tc.minor, tc.ino, tc.self); got != tc.want {
				t.Errorf("holderIn = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestOpenStoreLockedNamesHolder: a state file another process holds
// (flock, as bbolt takes it) fails with the state dir and that pid.
func TestOpenStoreLockedNamesHolder(t *testing.T) {
	if _, err := os.Stat("/proc/locks"); err != nil {
		t.Skip("no /proc/locks")
	}
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	holder := exec.Command("flock", "--exclusive", path, "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	wait.Until(t, 10*time.Second, "flock(1) holds the file", func() bool { return lockHolder(path, "/proc/locks") != 0 })
	// flock(1) forks sleep, which inherits the lock: either pid may show.
	for _, open := range []func(string) (*Store, error){OpenStore, OpenStoreReadOnly} {
		_, err = open(path)
		var le *LockedError
		if !errors.As(err, &le) || !errors.Is(err, berrors.ErrTimeout) {
			t.Fatalf("open a held file: %v, want a LockedError", err)
		}
		if le.Pid == 0 || !strings.Contains(err.Error(), "state dir "+dir+" is locked by another gcagent (pid ") {
			t.Errorf("error %q: want the dir and a pid", err)
		}
	}
}
