package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockName is what Exclusive accepts: it becomes a file name.
var lockName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// Exclusive makes t the only holder of name on this machine until t ends,
// waiting up to within for the holder before it: an flock on
// /tmp/gcagent-test-<name>.lock, held across test processes (go test runs
// packages side by side) and by parallel tests of one process alike.
// Tests that use something of the machine no private directory can stand
// in for take it first: the kubelet's fixed /var/log/containers, a sysctl.
// A test that cannot get it within fails.
func Exclusive(t testing.TB, name string, within time.Duration) {
	t.Helper()
	if !lockName.MatchString(name) {
		t.Fatalf("testenv.Exclusive: name %q: want lower-case letters, digits and dashes", name)
	}
	path := filepath.Join(os.TempDir(), "gcagent-test-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if err != unix.EWOULDBLOCK {
			f.Close()
			t.Fatalf("lock %s: %v", path, err)
		}
		if time.Since(start) > within {
			f.Close()
			t.Fatalf("%s held by another test for over %s", path, within)
		}
		time.Sleep(100 * time.Millisecond) // ask again: flock has no timeout
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("waited %s for %s", d.Round(time.Millisecond), name)
	}
	t.Cleanup(func() { f.Close() }) // closing the file releases the lock
}
