package trace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var t0 = time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func img(s int, digest string, names ...string) Record {
	return Record{T: at(s), Ev: KindImage, NS: "k8s.io", Digest: digest, Names: names, Size: 10}
}

func ev(s int, k Kind, digest string) Record {
	return Record{T: at(s), Ev: k, NS: "k8s.io", Digest: digest}
}

func gcRec(s int, digest string, freed int64) Record {
	return Record{T: at(s), Ev: KindGC, NS: "k8s.io", Digest: digest, Rule: "space", Trigger: "disk", Freed: freed, Size: 10}
}

func kinds(recs []Record) string {
	var parts []string
	for _, r := range recs {
		p := string(r.Ev) + ":" + r.Digest
		if r.By != "" {
			p += "/" + r.By
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

func TestCanonicalPairsRemovals(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Record
		want string
	}{
		{"gc before gone", []Record{img(0, "a"), gcRec(10, "a", 7), ev(10, KindGone, "a")},
			"image:a removed:a/gcagent"},
		{"gone before gc", []Record{img(0, "a"), ev(10, KindGone, "a"), gcRec(11, "a", 7)},
			"image:a removed:a/gcagent"},
		{"gone long after gc (a restart's listing)", []Record{img(0, "a"), gcRec(10, "a", 7), ev(4000, KindGone, "a")},
			"image:a removed:a/gcagent"},
		{"someone else", []Record{img(0, "a"), ev(10, KindGone, "a")},
			"image:a removed:a/other"},
		{"gc of another removal", []Record{img(0, "a"), ev(10, KindGone, "a"), gcRec(200, "a", 7)},
			"image:a removed:a/other"},
		{"another image's", []Record{img(0, "a"), img(0, "b"), gcRec(10, "b", 7), ev(10, KindGone, "a")},
			"image:a image:b removed:a/other"},
		{"sorted by time", []Record{ev(5, KindUse, "a"), img(0, "a"), ev(6, KindIdle, "a")},
			"image:a use:a idle:a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Canonical(tc.in)
			if k := kinds(got); k != tc.want {
				t.Fatalf("got %s, want %s", k, tc.want)
			}
			for _, r := range got {
				if r.By == ByAgent && (r.Rule != "space" || r.Trigger != "disk" || r.Freed != 7) {
					t.Errorf("removal by the agent without the gc record's facts: %+v", r)
				}
			}
		})
	}
}

func TestFold(t *testing.T) {
	recs := []Record{
		{T: at(0), Ev: KindPolicy, Policy: &Policy{High: 85, Low: 80}},
		img(1, "a", "a:1"), img(2, "b", "b:1"), img(3, "c", "c:1"),
		ev(4, KindUse, "a"), ev(5, KindIdle, "a"), ev(6, KindUse, "b"),
		ev(7, KindGone, "c"),
		{T: at(8), Ev: KindDisk, Disk: &Disk{Capacity: 100, Available: 40}},
		{T: at(9), Ev: KindImage, NS: "k8s.io", Digest: "a", Names: []string{"a:1", "a:2"}, Size: 12, Pinned: true},
	}
	base := Fold(nil, recs, time.Time{})
	want := []string{
		"policy  0 0001-01-01 0001-01-01 false",
		"disk  0 0001-01-01 0001-01-01 false",
		"image a 12 " + at(1).Format(time.RFC3339) + " " + at(5).Format(time.RFC3339) + " false",
		"image b 10 " + at(2).Format(time.RFC3339) + " " + at(6).Format(time.RFC3339) + " true",
	}
	if len(base) != len(want) {
		t.Fatalf("base %s", kinds(base))
	}
	for i, r := range base {
		got := fmt.Sprintf("%s %s %d %s %s %v", r.Ev, r.Digest, r.Size, day(r.FirstSeen), day(r.LastUsed), r.Used)
		if got != want[i] {
			t.Errorf("base[%d] = %s, want %s", i, got, want[i])
		}
		if !r.T.Equal(at(9)) {
			t.Errorf("base[%d] at %s, want the last record's time", i, r.T)
		}
	}
	if !base[2].Pinned || len(base[2].Names) != 2 {
		t.Errorf("a's names and pin not kept: %+v", base[2])
	}
	// Folding again on top of a base keeps first seen and last used.
	again := Fold(base, []Record{ev(20, KindUse, "a")}, time.Time{})
	if r := again[2]; !r.FirstSeen.Equal(at(1)) || !r.LastUsed.Equal(at(20)) || !r.Used {
		t.Errorf("refolded a: %+v", r)
	}
}

func day(t time.Time) string {
	if t.IsZero() {
		return "0001-01-01"
	}
	return t.Format(time.RFC3339)
}

func openDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func loadAll(t *testing.T, db *bolt.DB) []Record {
	t.Helper()
	recs, skipped, err := Load(db)
	if err != nil {
		t.Fatal(err)
	}
	if skipped.Any() {
		t.Errorf("load skipped %s", skipped)
	}
	return recs
}

func TestLogCompactsAndBoundsByAge(t *testing.T) {
	db := openDB(t)
	l, err := Open(db, Options{MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Fresh() {
		t.Fatal("a new file's trace is not fresh")
	}
	for i := range 100 {
		d := fmt.Sprintf("d%d", i)
		if err := l.Put(img(i*60, d, d+":1"), ev(i*60+1, KindUse, d), ev(i*60+30, KindIdle, d)); err != nil {
			t.Fatal(err)
		}
		if i%10 == 9 {
			if err := l.Compact(at(i*60 + 59)); err != nil {
				t.Fatal(err)
			}
		}
	}
	recs := loadAll(t, db)
	// 100 minutes, one hour kept: the chunks older than an hour (10
	// images each) are folded into the base, which holds all 40 images
	// (none was removed) at the time of the last folded record.
	var base, images int
	for _, r := range recs {
		if r.Ev == KindImage {
			images++
			if !r.FirstSeen.IsZero() {
				base++
			}
		}
	}
	if images != 100 || base != 40 {
		t.Errorf("%d image records, %d in the base; want 100 and 40", images, base)
	}
	if recs[0].T.Before(at(99*60 + 59).Add(-time.Hour - 10*time.Minute)) {
		t.Errorf("trace starts at %s: older than the bound", recs[0].T)
	}
	n, chunks, err := Size(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes in %d chunks", n, chunks)
	l2, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fresh() {
		t.Error("a trace with records is fresh on reopening")
	}
}

func TestLogBoundsBySize(t *testing.T) {
	db := openDB(t)
	l, err := Open(db, Options{MaxBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
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
	n, _, err := Size(db)
	if err != nil {
		t.Fatal(err)
	}
	if n > 8<<10+4<<10 { // the newest chunk always stays
		t.Errorf("trace holds %d bytes, bound 8 KiB", n)
	}
	if recs := loadAll(t, db); len(recs) == 0 || recs[len(recs)-1].T.Before(at(1999)) {
		t.Errorf("the newest records are gone: %d left", len(recs))
	}
}

func TestLogDiskAndPolicy(t *testing.T) {
	db := openDB(t)
	l, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := func(avail uint64) Disk { return Disk{Capacity: 1000, Available: avail} }
	steps := []struct {
		t       time.Time
		d       Disk
		trigger string
		want    bool
	}{
		{at(0), d(500), "", true},                               // first
		{at(0).Add(time.Millisecond), d(499), "", false},        // same percent
		{at(0).Add(500 * time.Millisecond), d(480), "", false},  // moved, within a second
		{at(2), d(480), "", true},                               // moved, later
		{at(2).Add(time.Millisecond), d(480), "disk", true},     // a pass
		{at(3), Disk{Capacity: 2000, Available: 960}, "", true}, // resized
	}
	for i, s := range steps {
		got, err := l.Disk(s.t, s.d, s.trigger)
		if err != nil {
			t.Fatal(err)
		}
		if got != s.want {
			t.Errorf("step %d: recorded %v, want %v", i, got, s.want)
		}
	}
	p := Policy{High: 85, Low: 80, MinAge: Duration(2 * time.Minute)}
	for range 3 {
		if err := l.Policy(at(5), p); err != nil {
			t.Fatal(err)
		}
	}
	p.KeepPatterns = []string{"nginx:*"}
	if err := l.Policy(at(6), p); err != nil {
		t.Fatal(err)
	}
	var disks, policies int
	for _, r := range loadAll(t, db) {
		switch r.Ev {
		case KindDisk:
			disks++
		case KindPolicy:
			policies++
		}
	}
	if disks != 4 || policies != 2 {
		t.Errorf("%d disk and %d policy records, want 4 and 2", disks, policies)
	}
}

func TestDecodeSkipsBadLines(t *testing.T) {
	var buf bytes.Buffer
	if err := Export(&buf, Record{Node: "n1"}, []Record{img(0, "a", "a:1"), ev(1, KindUse, "a")}); err != nil {
		t.Fatal(err)
	}
	in := buf.String() + "not json\n{\"ev\":\"use\"}\n" + `{"t":"2026-05-01T00:00:09Z","ev":"idle","ns":"k8s.io","digest":"a"}` + "\n"
	var got []Record
	var bad []int
	err := Decode(strings.NewReader(in), func(r Record) error { got = append(got, r); return nil },
		func(line int, _ error) { bad = append(bad, line) })
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(got); k != "trace: image:a use:a idle:a" {
		t.Errorf("decoded %s", k)
	}
	if fmt.Sprint(bad) != "[4 5]" {
		t.Errorf("bad lines %v, want [4 5]", bad)
	}
	if got[0].Version != Version || got[0].Node != "n1" || !got[0].From.Equal(at(0)) || !got[0].To.Equal(at(1)) {
		t.Errorf("header %+v", got[0])
	}
	if err := Decode(strings.NewReader("nope\n"), func(Record) error { return nil }, nil); err == nil {
		t.Error("a bad line without a handler is no error")
	}
}

// TestAppendRecordIsEncodingJSON: the fast encoder writes exactly what
// encoding/json writes, for every kind, and leaves to it what it cannot.
func TestAppendRecordIsEncodingJSON(t *testing.T) {
	local := time.FixedZone("x", 3600)
	recs := []Record{
		img(0, "sha256:a", "a:1", "sha256:c"),
		{T: at(1).Add(123456789), Ev: KindImage, NS: "default", Digest: "d", Names: []string{"x"}, Size: -3, Pinned: true,
			FirstSeen: at(0).In(local), LastUsed: at(1), Used: true},
		ev(2, KindUse, "a"), ev(3, KindIdle, "a"), ev(4, KindGone, "a"), gcRec(5, "a", 99),
		{T: at(6), Ev: KindRemoved, NS: "k8s.io", Digest: "a", By: ByAgent, Rule: "max-age", Trigger: "max-age", Freed: 1},
		{T: at(7), Ev: KindImage, NS: "k8s.io", Digest: "a", Names: []string{"evil<&>\"\\\n名"}},
		{T: at(8), Ev: KindDisk, Disk: &Disk{Capacity: 1, Available: 0}, Trigger: "disk"},
		{T: at(9), Ev: KindPolicy, Policy: &Policy{High: 85, MinAge: Duration(time.Minute)}},
		{T: at(10), Ev: KindStart, Node: "n", Cluster: "c"},
		{Ev: KindHeader, Version: 1, From: at(0), To: at(10)},
		{T: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Ev: KindUse, NS: "k8s.io", Digest: "a"},
	}
	for i := range recs {
		want, wantErr := json.Marshal(&recs[i])
		got, err := appendRecord(nil, &recs[i])
		if (err != nil) != (wantErr != nil) {
			t.Errorf("record %d: error %v, encoding/json %v", i, err, wantErr)
			continue
		}
		if err == nil && string(got) != string(want)+"\n" {
			t.Errorf("record %d:\n%s\nencoding/json:\n%s", i, got, want)
		}
	}
}

// TestLogCompactsWhileTheJournalWrites: records put inside other
// transactions (the journal's) while compactions run neither deadlock
// nor get lost.
func TestLogCompactsWhileTheJournalWrites(t *testing.T) {
	db := openDB(t)
	l, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for i := range 300 {
			if err := l.Compact(at(i)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range 300 {
		err := db.Update(func(tx *bolt.Tx) error { return l.PutTx(tx, []Record{ev(i, KindUse, fmt.Sprint(i))}) })
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(loadAll(t, db)); n != 300 {
		t.Errorf("%d records, want 300", n)
	}
}
