package projection

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/events"
	bolt "go.etcd.io/bbolt"
)

// writeStore makes a state file holding a snapshot and a journal, as an
// agent leaves it, and returns the state it restores to.
func writeStore(t *testing.T, path string) *State {
	t.Helper()
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	var evs []events.Event
	for i := range 300 {
		ev := events.ImageUpserted{At: at(i), Name: fmt.Sprintf("example.test/img-%03d:1", i), Digest: fmt.Sprintf("sha256:%064d", i), Size: int64(i)}
		s.Apply(ev)
		evs = append(evs, ev)
		if i == 150 {
			if err := st.Append(s.Seq, evs); err != nil {
				t.Fatal(err)
			}
			if err := st.Snapshot(s.Clone()); err != nil {
				t.Fatal(err)
			}
			evs = nil
		}
	}
	if err := st.Append(s.Seq, evs); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOpenStoreOrReset(t *testing.T) {
	cases := []struct {
		name    string
		damage  func(t *testing.T, path string, good []byte)
		wantErr string // in Reset.Err
	}{
		{"garbage bytes", func(t *testing.T, path string, good []byte) {
			b := make([]byte, len(good))
			r := rand.New(rand.NewPCG(1, 2))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			writeFile(t, path, b)
		}, "invalid database"},
		{"truncated to half", func(t *testing.T, path string, good []byte) { writeFile(t, path, good[:len(good)/2]) }, "truncated"},
		{"truncated below two pages", func(t *testing.T, path string, good []byte) { writeFile(t, path, good[:5000]) }, ""},
		{"empty", func(t *testing.T, path string, good []byte) { writeFile(t, path, nil) }, "empty"},
		{"data pages overwritten", func(t *testing.T, path string, good []byte) {
			b := bytes.Clone(good)
			for i := 4 * 4096; i < len(b); i++ { // keep both meta pages, break what they point at
				b[i] = 0xa5
			}
			writeFile(t, path, b)
		}, ""},
		{"snapshot is not JSON", func(t *testing.T, path string, good []byte) {
			putSnapshot(t, path, []byte("{not json"))
		}, "decode snapshot"},
		{"binary snapshot truncated", func(t *testing.T, path string, good []byte) {
			b := encodeSnapshot(fullState(t))
			putSnapshot(t, path, b[:len(b)-3])
		}, "decode snapshot"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			writeStore(t, path)
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path, good)
			damaged, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			st, reset, err := OpenStoreOrReset(path, t0)
			if err != nil {
				t.Fatalf("not reset: %v", err)
			}
			defer st.Close()
			if reset == nil {
				t.Fatal("an unreadable file was opened as it is")
			}
			if !strings.Contains(reset.Err.Error(), tc.wantErr) {
				t.Errorf("reset error %q, want it to say %q", reset.Err, tc.wantErr)
			}
			if want := path + ".corrupt-20261122T100000.000000000Z"; reset.MovedTo != want {
				t.Errorf("moved to %s, want %s", reset.MovedTo, want)
			}
			kept, err := os.ReadFile(reset.MovedTo)
			if err != nil || !bytes.Equal(kept, damaged) {
				t.Errorf("the unreadable file was not kept byte for byte (%v)", err)
			}
			res, err := st.Load()
			if err != nil || len(res.State.Images) != 0 || res.State.Seq != 0 {
				t.Fatalf("new store: %d images, seq %d, %v", len(res.State.Images), res.State.Seq, err)
			}
			// The new store works.
			if err := st.Append(1, []events.Event{events.Synced{At: t0}}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestOpenStoreOrResetKeepsGoodAndBusyFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	want := writeStore(t, path)
	st, reset, err := OpenStoreOrReset(path, t0)
	if err != nil || reset != nil {
		t.Fatalf("good file: reset %+v, err %v", reset, err)
	}
	res, err := st.Load()
	if err != nil || len(res.State.Images) != len(want.Images) || res.State.Seq != want.Seq {
		t.Fatalf("good file restored %d images seq %d (%v), want %d seq %d", len(res.State.Images), res.State.Seq, err,
			len(want.Images), want.Seq)
	}
	// A second agent on the same file must fail, not move the first one's
	// file away.
	st2, reset, err := OpenStoreOrReset(path, t0)
	if err == nil || reset != nil {
		t.Fatalf("busy file: reset %+v, err %v", reset, err)
		st2.Close()
	}
	st.Close()
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 0 {
		t.Fatalf("moved aside: %v", matches)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReadStore: tools read a good file and get an error, not a panic,
// from a damaged one.
func TestReadStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	want := writeStore(t, path)
	res, err := ReadStore(path)
	if err != nil || len(res["k8s.io"].State.Images) != len(want.Images) {
		t.Fatalf("good file: %v, %v", res, err)
	}
	good, _ := os.ReadFile(path)
	b := bytes.Clone(good)
	for i := 4 * 4096; i < len(b); i++ {
		b[i] = 0xa5
	}
	writeFile(t, path, b)
	if _, err := ReadStore(path); err == nil {
		t.Fatal("damaged file read without an error")
	}
}

// putSnapshot overwrites the k8s.io snapshot of the store file at path.
func putSnapshot(t *testing.T, path string, b []byte) {
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	err = st.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySnapshot, b) })
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
}
