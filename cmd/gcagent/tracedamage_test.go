package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/trace"
	bolt "go.etcd.io/bbolt"
)

// stateWithTrace writes a state file in a new dir whose trace holds n
// records, one chunk each, and returns the dir and the file's path.
func stateWithTrace(t *testing.T, n int) (string, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := trace.Open(db, trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour).UTC()
	for i := range n {
		if err := l.Put(trace.Record{T: t0.Add(time.Duration(i) * time.Second), Ev: trace.KindImage, NS: "k8s.io",
			Digest: fmt.Sprintf("sha256:%064d", i), Names: []string{fmt.Sprintf("img-%d:1", i)}, Size: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// damageBranch halves the element count of the first bucket root that is
// a branch page: half its leaves, and their records, are cut off.
func damageBranch(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	page, size := -1, db.Info().PageSize
	_ = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			if info, err := tx.Page(int(b.Root())); err == nil && info.Type == "branch" && page < 0 {
				page = info.ID
			}
			return nil
		})
	})
	db.Close()
	if page < 0 {
		t.Fatal("no bucket has a branch root: write more records")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cnt [2]byte
	if _, err := f.ReadAt(cnt[:], int64(page*size+10)); err != nil {
		t.Fatal(err)
	}
	half := (int(cnt[0]) | int(cnt[1])<<8) / 2
	if _, err := f.WriteAt([]byte{byte(half), byte(half >> 8)}, int64(page*size+10)); err != nil {
		t.Fatal(err)
	}
}

// TestTraceExportDamagedState: trace export of a state file that can be
// read only in part writes what it read, says so and exits non-zero (on
// d7dd547: part of the lines, exit 0, no word); a truncated, empty or
// absent file, or no agent for status, gives one plain line instead of
// bbolt's or the dialer's raw errors.
func TestTraceExportDamagedState(t *testing.T) {
	dir, path := stateWithTrace(t, 400)
	noAgent := "127.0.0.1:1" // nothing listens on port 1
	out, _, err := runCLI(context.Background(), nil, "trace", "export", "--state-dir", dir, "--metrics-address", noAgent)
	if err != nil || strings.Count(out, "\n") != 401 {
		t.Fatalf("a whole file: %d lines, %v", strings.Count(out, "\n"), err)
	}
	b, _ := os.ReadFile(path)
	damageBranch(t, path)
	out, _, err = runCLI(context.Background(), nil, "trace", "export", "--state-dir", dir, "--metrics-address", noAgent)
	lines := strings.Count(out, "\n")
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "partial export: state "+path+" is damaged") || lines <= 1 || lines >= 401 {
		t.Errorf("a damaged file: %d lines, %v; want part of them, and an error that says so", lines, err)
	}
	for _, tc := range []struct {
		content []byte
		want    string
	}{
		{b[:len(b)/2], "state " + path + " unreadable: state file is " + fmt.Sprint(len(b)/2) + " bytes, its meta page says"},
		{nil, "state " + path + " is empty (0 bytes): not a state file"},
	} {
		if err := os.WriteFile(path, tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := runCLI(context.Background(), nil, "trace", "export", "--state-dir", dir, "--metrics-address", noAgent)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%d bytes: %v, want %q", len(tc.content), err, tc.want)
		}
	}
	os.Remove(path)
	_, _, err = runCLI(context.Background(), nil, "trace", "export", "--state-dir", dir, "--metrics-address", noAgent)
	if want := "no state file " + path + " (no agent ran with --state-dir " + dir + "), and no agent answers at " + noAgent; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("no state: %v, want %q", err, want)
	}
	_, _, err = runCLI(context.Background(), nil, "status", "--metrics-address", noAgent)
	if want := "status: no agent at " + noAgent + " (nothing listens there)"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("status without an agent: %v, want %q", err, want)
	}
}
