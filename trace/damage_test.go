package trace

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// damaged is a trace with records the strict reader refuses and chunks
// that do not decode, written behind the Log's back as an earlier version
// or a damaged disk leaves them, between good chunks.
func damaged(t *testing.T, db *bolt.DB) {
	t.Helper()
	err := db.Update(func(tx *bolt.Tx) error {
		b, bb := tx.Bucket(bucketChunks), tx.Bucket(bucketBase)
		put := func(v []byte) error {
			seq, err := b.NextSequence()
			if err != nil {
				return err
			}
			return b.Put(seqKey(seq), v)
		}
		head := func(format byte, last time.Time) []byte {
			h := make([]byte, chunkHeader)
			h[0] = format
			binary.BigEndian.PutUint64(h[1:], uint64(last.UnixNano()))
			return h
		}
		// A plain chunk with one record of no time (d7dd547 stored it).
		plain := append(head(formatPlain, at(60)), []byte(`{"t":"2026-05-01T00:01:00Z","ev":"use","ns":"k8s.io","digest":"a"}`+"\n"+
			`{"t":"0001-01-01T00:00:00Z","ev":"use","ns":"k8s.io","digest":"b"}`+"\n")...)
		for _, v := range [][]byte{
			plain,
			append(head(formatDeflated, at(70)), "not deflate at all"...), // a broken deflate stream
			append(head(9, at(80)), "{}"...),                              // a format nobody wrote
			{formatDeflated, 1, 2},                                        // no header
		} {
			if err := put(v); err != nil {
				return err
			}
		}
		return bb.Put(keyBase, append(head(formatDeflated, at(0)), 0xff, 0xfe)) // a base that does not decode
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCompactBoundsWhateverTheTraceHolds (issue 40, item 8): stored
// records the strict reader refuses and chunks (and a base) that do not
// decode no longer fail every compaction: each chunk is dropped, counted
// and logged once, each refused record left out and counted, and
// --trace-max-age and --trace-max-bytes are applied again. On d7dd547
// every Compact failed ("compact trace: format 9", "no time or kind")
// and the trace grew without bound.
func TestCompactBoundsWhateverTheTraceHolds(t *testing.T) {
	db := openDB(t)
	var logged bytes.Buffer
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(db, Options{MaxAge: time.Hour, MaxBytes: 64 << 10, Metrics: m, Log: zerolog.New(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put(img(0, "a", "a:1"), img(1, "b", "b:1")); err != nil {
		t.Fatal(err)
	}
	damaged(t, db)
	if err := l.Compact(at(90)); err != nil {
		t.Fatalf("compaction of a damaged trace: %v", err)
	}
	// Ten minutes of images in chunks of their own, for eight hours.
	for i := range 48 {
		var batch []Record
		for j := range deflateRecords {
			d := fmt.Sprintf("sha256:%03d%061d", i, j)
			batch = append(batch, img(100+i*600+j, d, d))
		}
		if err := l.Put(batch...); err != nil {
			t.Fatal(err)
		}
	}
	now := at(100 + 47*600 + 60)
	if err := l.Compact(now); err != nil {
		t.Fatalf("compaction of a damaged trace: %v", err)
	}
	if got := testutil.ToFloat64(m.dropped.WithLabelValues("chunk")); got != 4 {
		t.Errorf("chunks dropped %v, want 4 (the broken stream, the unknown format, the one without a header, the base)", got)
	}
	if got := testutil.ToFloat64(m.dropped.WithLabelValues("record")); got != 1 {
		t.Errorf("records dropped %v, want 1 (the one without a time)", got)
	}
	if n := strings.Count(logged.String(), "a chunk that does not decode is dropped"); n != 4 {
		t.Errorf("%d chunk drops logged, want 4:\n%s", n, logged.String())
	}
	// The bounds hold: nothing older than the hour before now but the
	// base, and the base is the images present then.
	recs, skipped, err := Load(db)
	if err != nil || skipped.Any() {
		t.Fatalf("load after the compaction: %v, skipped %s", err, skipped)
	}
	for _, r := range recs {
		if r.FirstSeen.IsZero() && r.T.Before(now.Add(-time.Hour-10*time.Minute)) {
			t.Errorf("record %s %s of %s: older than the bound", r.Ev, r.Digest, r.T)
		}
	}
	// Nothing left to drop: a second compaction drops and logs nothing.
	logged.Reset()
	if err := l.Compact(now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if logged.Len() != 0 || testutil.ToFloat64(m.dropped.WithLabelValues("chunk")) != 4 {
		t.Errorf("a second compaction dropped again: %s", logged.String())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gcagent_trace_dropped_total Stored usage trace chunks (the base included) and records that did not decode, dropped by compaction, by what.
# TYPE gcagent_trace_dropped_total counter
gcagent_trace_dropped_total{what="chunk"} 4
gcagent_trace_dropped_total{what="record"} 1
# HELP gcagent_trace_records_refused_total Usage trace records not stored because the trace's reader would refuse them (no time or kind, not encodable, too long).
# TYPE gcagent_trace_records_refused_total counter
gcagent_trace_records_refused_total 0
`)); err != nil {
		t.Error(err)
	}
}

// TestCompactBoundsBySizeOverADamagedBase: a base that does not decode
// no longer stops the size bound: the oldest chunks are folded into a new
// base all the same.
func TestCompactBoundsBySizeOverADamagedBase(t *testing.T) {
	db := openDB(t)
	l, err := Open(db, Options{MaxBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	damaged(t, db)
	for i := range 2000 {
		d := fmt.Sprintf("sha256:%064d", i%50)
		if err := l.Put(ev(i, KindUse, d), ev(i, KindIdle, d)); err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			if err := l.Compact(at(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, _, err := Size(db); err != nil || n > 8<<10+4<<10 {
		t.Errorf("trace holds %d bytes (%v), bound 8 KiB", n, err)
	}
}

// TestWriterRefusesWhatTheReaderRefuses (issue 40, item 8): a record the
// strict reader would refuse (no time, no kind, not encodable, a line too
// long) is not stored: Put still stores the rest and fails nothing (it
// runs inside the journal's transaction), the refusal is counted, and
// the first one logged. Every read then reads the whole trace. On
// d7dd547 the one without a time was stored and every later read and
// compaction failed, and the one encoding/json refuses failed Put (the
// journal's transaction with it).
func TestWriterRefusesWhatTheReaderRefuses(t *testing.T) {
	db := openDB(t)
	var logged bytes.Buffer
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(db, Options{Metrics: m, Log: zerolog.New(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("n", maxLine)
	bad := []Record{
		{Ev: KindUse, NS: "k8s.io", Digest: "zero-time"},
		{T: at(1), NS: "k8s.io", Digest: "no-kind"},
		{T: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Ev: KindUse, NS: "k8s.io", Digest: "year-10000"},
		{T: at(1), Ev: KindImage, NS: "k8s.io", Digest: "long", Names: []string{long}},
		{Ev: KindDisk, Disk: &Disk{Capacity: 1}}, // through encoding/json
	}
	good := []Record{img(0, "a", "a:1"), ev(2, KindUse, "a"), {T: at(3), Ev: KindDisk, Disk: &Disk{Capacity: 10, Available: 5}}}
	for _, deflate := range []int{1, deflateRecords} { // a plain chunk, a deflated one
		var batch []Record
		for range deflate {
			batch = append(batch, good...)
		}
		batch = append(batch, bad...)
		if err := db.Update(func(tx *bolt.Tx) error { return l.PutTx(tx, batch) }); err != nil {
			t.Fatalf("a batch with records the reader refuses: %v", err)
		}
	}
	if err := l.Put(bad[0]); err != nil {
		t.Fatalf("a chunk of refused records only: %v", err)
	}
	recs, skipped, err := Load(db)
	if err != nil || skipped.Any() {
		t.Fatalf("load: %v, skipped %s", err, skipped)
	}
	if want := len(good) * (1 + deflateRecords); len(recs) != want {
		t.Errorf("%d records stored, want %d (the good ones)", len(recs), want)
	}
	for _, r := range recs {
		if r.T.IsZero() || r.Ev == "" || r.Digest == "zero-time" || r.Digest == "year-10000" || r.Digest == "long" {
			t.Errorf("refused record stored: %s %s", r.Ev, r.Digest)
		}
	}
	if got, want := testutil.ToFloat64(m.refused), float64(2*len(bad)+1); got != want {
		t.Errorf("%v records refused, want %v", got, want)
	}
	if n := strings.Count(logged.String(), "\n"); n != 1 || !strings.Contains(logged.String(), "not stored") {
		t.Errorf("logged %d lines, want the first refusal once:\n%.300s", n, logged.String())
	}
	if err := l.Compact(at(10)); err != nil {
		t.Errorf("compaction: %v", err)
	}
}

// TestReadSkipsAndSaysWhatItCannotRead (issue 40, item 8): a read of a
// damaged trace (what replay reads from a state file, and the agent's
// /trace) returns every record it can decode and says what it skipped,
// in Load's Skipped and in the export's header; `replay` and `trace
// export` read it from the state file. On d7dd547 Load failed on the
// first such chunk and so did /trace (500) and replay.
func TestReadSkipsAndSaysWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put(img(0, "a", "a:1"), ev(1, KindUse, "a"), Record{T: at(2), Ev: KindStart, Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	damaged(t, db)
	if err := l.Put(ev(200, KindIdle, "a")); err != nil {
		t.Fatal(err)
	}
	recs, skipped, err := Load(db)
	if err != nil {
		t.Fatalf("load of a damaged trace: %v", err)
	}
	if k := kinds(recs); k != "image:a use:a start: use:a idle:a" {
		t.Errorf("read %s, want every record that decodes", k)
	}
	if skipped.Chunks != 4 || skipped.Records != 1 || !strings.Contains(skipped.First, "base") {
		t.Errorf("skipped %+v, want 4 chunks (the base first) and 1 record", skipped)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	header, got, from, err := Fetch(context.Background(), Source{StateDir: dir})
	if err != nil {
		t.Fatalf("fetch from %s: %v", from, err)
	}
	if len(got) != len(recs) || header.Skipped == nil || *header.Skipped != skipped || header.Node != "n1" {
		t.Errorf("fetched %d records, header %+v; want %d and what was skipped", len(got), header, len(recs))
	}
	var out bytes.Buffer
	if err := ExportCommand(context.Background(), ExportOptions{Source: Source{StateDir: dir}}, &out); err != nil {
		t.Fatal(err)
	}
	back, _, err := decodeAll(&out, nil)
	if err != nil || back.Skipped == nil || *back.Skipped != skipped {
		t.Errorf("the export's header %+v (%v), want what was skipped: %+v", back, err, skipped)
	}
}
