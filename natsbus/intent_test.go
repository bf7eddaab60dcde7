package natsbus

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/wait"
)

// TestIntentSurvivesCrashBetweenDeleteAndEvent: a real bbolt outbox, a
// real file as the object deleted. Intent A is recorded, the file deleted,
// and the process "dies" (the publisher is closed without completing A:
// nothing more reaches the outbox). Intent B is recorded and the delete
// never happens. After a restart on the same state dir, Pending lists both;
// resolving them by asking the file system publishes A's event exactly once
// (also when resolved twice) and drops B. An intent completed before the
// crash is not pending after it and its event is stored once.
func TestIntentSurvivesCrashBetweenDeleteAndEvent(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	nc := connect(t, s.ClientURL())
	stateDir := t.TempDir()
	objects := t.TempDir()
	objA, objB, objC := filepath.Join(objects, "a"), filepath.Join(objects, "b"), filepath.Join(objects, "c")
	for _, f := range []string{objA, objB, objC} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removal := func(path string) Action {
		return Action{Kind: "image", Action: "removed", Subject: path, Key: "same-key", Data: map[string]any{"path": path}}
	}

	p1, err := NewPublisher(nc, PublisherOptions{Cluster: "c1", Node: "node-1", StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	// C: intent, delete, complete, all before the crash.
	inC, err := p1.Intend("k8s.io", removal(objC), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(objC); err != nil {
		t.Fatal(err)
	}
	if err := p1.Complete(inC, map[string]any{"path": objC, "freedBytes": 1}); err != nil {
		t.Fatal(err)
	}
	// A: intent and delete, then the crash.
	inA, err := p1.Intend("k8s.io", removal(objA), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(objA); err != nil {
		t.Fatal(err)
	}
	// B: intent, then the crash before the delete. It records the
	// identity of what it deletes, which settling compares.
	idB := &deletion.Identity{Created: time.Date(2026, 3, 4, 5, 6, 7, 891, time.UTC),
		Names: []deletion.Name{{Name: "example.test/b:1", Created: time.Date(2026, 3, 4, 5, 6, 7, 892, time.UTC)}}}
	inB, err := p1.Intend("k8s.io", removal(objB), idB)
	if err != nil {
		t.Fatal(err)
	}
	if inA.Key == inB.Key || inA.Key == inC.Key {
		t.Fatalf("intents with the same caller key share an event key: %q %q %q", inA.Key, inB.Key, inC.Key)
	}
	wait.Until(t, 10*time.Second, "C's event stored before the crash", func() bool { return p1.Depth() == 0 })
	if err := p1.Close(); err != nil { // the process ends: A and B stay as they are on disk
		t.Fatal(err)
	}

	p2 := newPublisher(t, nc, stateDir, PublisherOptions{})
	pending, err := p2.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 || pending[0].Key != inA.Key || pending[1].Key != inB.Key {
		t.Fatalf("pending after restart: %+v, want A and B", pending)
	}
	if pending[0].Identity != nil {
		t.Errorf("A recorded no identity, but has %+v after the restart", pending[0].Identity)
	}
	if got := pending[1].Identity; got == nil || !got.Created.Equal(idB.Created) || len(got.Names) != 1 ||
		got.Names[0].Name != idB.Names[0].Name || !got.Names[0].Created.Equal(idB.Names[0].Created) {
		t.Errorf("B's identity after the restart: %+v, want %+v", got, idB)
	}
	for range 2 { // resolving twice (a second restart) must not store a second event
		for _, in := range pending {
			_, err := os.Lstat(in.Subject)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				err = p2.Complete(in, nil)
			case err == nil:
				err = p2.Abandon(in)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if left, _ := p2.Pending(); len(left) != 0 {
		t.Errorf("intents left after resolving: %+v", left)
	}
	wait.Until(t, 10*time.Second, "A's event stored", func() bool { return p2.Depth() == 0 })
	idA := EventID("c1", "node-1", "image", "removed", inA.Key)
	idC := EventID("c1", "node-1", "image", "removed", inC.Key)
	assertExactlyOnce(t, nc, []string{idC, idA})

	// The epoch and sequence persist: a new intent after the restart gets a new key.
	inD, err := p2.Intend("k8s.io", removal(objB), nil)
	if err != nil {
		t.Fatal(err)
	}
	if inD.Seq <= inB.Seq || inD.Key == inB.Key {
		t.Errorf("intent after restart: seq %d key %q, after seq %d key %q", inD.Seq, inD.Key, inB.Seq, inB.Key)
	}
}
