package projection

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gcagent/gcagent/events"
)

// FuzzOpenStore writes arbitrary bytes as state.db and starts from it the
// way the agent does. Whatever the file holds, OpenStoreOrReset must never
// panic or fault: it opens the file, or moves it aside unchanged and opens
// a new one, or returns an error; a store it returns must load and take
// new journal entries.
func FuzzOpenStore(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "seed.db")
	writeStoreF(f, good)
	b, err := os.ReadFile(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:len(b)/2])
	f.Add(b[:8192])
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte("not a bbolt file "), 1024))
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		n++
		path := filepath.Join(dir, "state.db")
		_ = os.Remove(path)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		st, reset, err := OpenStoreOrReset(path, t0)
		if err != nil {
			if reset != nil || st != nil {
				t.Fatalf("error %v with a store or a reset", err)
			}
			return
		}
		defer st.Close()
		if reset != nil {
			kept, rerr := os.ReadFile(reset.MovedTo)
			if rerr != nil || !bytes.Equal(kept, data) {
				t.Fatalf("moved-aside file differs from what was found (%v)", rerr)
			}
			_ = os.Remove(reset.MovedTo)
		}
		res, err := st.Load()
		if err != nil {
			t.Fatalf("opened store does not load: %v", err)
		}
		if err := st.Append(res.State.Seq+1, []events.Event{events.Synced{At: t0}}); err != nil && !errors.Is(err, os.ErrClosed) {
			t.Fatalf("opened store does not take entries: %v", err)
		}
	})
}

// writeStoreF is writeStore for a fuzz target's setup.
func writeStoreF(f *testing.F, path string) {
	st, err := OpenStore(path)
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	s := New()
	for i := range 20 {
		ev := events.ImageUpserted{At: at(i), Name: "example.test/a:" + string(rune('a'+i)), Digest: "sha256:" + string(rune('a'+i))}
		s.Apply(ev)
		if err := st.Append(s.Seq, []events.Event{ev}); err != nil {
			f.Fatal(err)
		}
	}
	if err := st.Snapshot(s.Clone()); err != nil {
		f.Fatal(err)
	}
}
