package e2e

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/trace"
	bolt "go.etcd.io/bbolt"
)

// TestTraceServedPastWhatItCannotRead (issue 40, item 8): an agent whose
// state file's usage trace holds a chunk that does not decode (an earlier
// version's, a damaged disk's) serves /trace all the same: every record
// it can read, and in the export's header what it skipped; the trace's
// metrics are there from the start. On d7dd547 /trace answered 500
// ("trace chunk N: format 9") until the file was removed.
func TestTraceServedPastWhatItCannotRead(t *testing.T) {
	t.Parallel()
	c := testenv.StartContainerd(t, testenv.Options{Version: testenv.Versions()[0]})
	c.Import(t, testenv.Runnable(gcImage))
	state := filepath.Join(t.TempDir(), "state")
	a := testenv.StartAgent(t, c, state)
	waitSynced(t, a)
	a.Stop()

	db, err := bolt.Open(filepath.Join(state, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("trace"))
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		k := make([]byte, 8)
		binary.BigEndian.PutUint64(k, seq)
		return b.Put(k, []byte{9, 0, 0, 0, 0, 0, 0, 0, 0, '{', '}'}) // a format nobody wrote
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	a = testenv.StartAgent(t, c, state)
	waitSynced(t, a)
	code, body, err := a.GetText("/trace")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/trace: %d %v: %.300s", code, err, body)
	}
	first, rest, _ := strings.Cut(body, "\n")
	var h trace.Record
	if err := json.Unmarshal([]byte(first), &h); err != nil || h.Ev != trace.KindHeader {
		t.Fatalf("header %q: %v", first, err)
	}
	m := mustMetrics(t, a)
	switch {
	case h.Skipped != nil:
		if h.Skipped.Chunks != 1 || !strings.Contains(h.Skipped.First, "format 9") {
			t.Errorf("header %+v: want the chunk skipped, and why", h)
		}
	case !containsLine(m, `gcagent_trace_dropped_total{what="chunk"} 1`):
		// Else a compaction reached the chunk first and dropped it.
		t.Errorf("header %+v says nothing skipped, and no chunk was dropped", h)
	}
	if !strings.Contains(rest, `"ev":"image"`) || !strings.Contains(rest, `"ev":"start"`) {
		t.Errorf("/trace lacks the records that decode:\n%.500s", rest)
	}
	for _, want := range []string{`gcagent_trace_dropped_total{what="record"} 0`, `gcagent_trace_records_refused_total 0`} {
		if !containsLine(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
