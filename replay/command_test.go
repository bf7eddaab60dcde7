package replay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/internal/tracegen"
	"github.com/gcagent/gcagent/trace"
	bolt "go.etcd.io/bbolt"
)

func writeTrace(t *testing.T, recs []trace.Record, extra string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := trace.Export(&buf, trace.Record{Node: "n1"}, recs); err != nil {
		t.Fatal(err)
	}
	buf.WriteString(extra)
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCommand: a trace file replayed with the recorded policy prints the
// same on both sides; a malformed line is said and skipped; --json is
// the Result; a sweep prints one row per value, the frontier marked.
func TestCommand(t *testing.T) {
	path := writeTrace(t, tracegen.Generate(smallBusyNode()), "{not a record}\n")
	var out, errOut bytes.Buffer
	err := Command(context.Background(), CommandOptions{Source: trace.Source{File: path}}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if !strings.Contains(errOut.String(), "skipped") {
		t.Errorf("the bad line is not said: %q", errOut.String())
	}
	for _, want := range []string{"node n1", "high 85%, low 80%, minimum age 2m0s", "deletions", "re-pulls", "mean free"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "deletions" && f[1] != f[2] {
			t.Errorf("replaying the recorded policy: %s", line)
		}
	}

	out.Reset()
	err = Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, JSON: true}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Replayed.Deletions == 0 || res.Recorded.Deletions != res.Replayed.Deletions || res.Recorded.RepulledBytes != res.Replayed.RepulledBytes {
		t.Errorf("json: %v: %+v", err, res)
	}

	out.Reset()
	err = Command(context.Background(), CommandOptions{Source: trace.Source{File: path}, Sweep: FlagHigh + "=75..95:10"}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{"75%", "85%", "95%", "70%", "80%", "*"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("sweep output lacks %q", want)
		}
	}
	// The low threshold follows the high one down where it would exceed it
	// (75%: 70%), and stays where it fits (95%: 80%), as
	// `replay --image-gc-high-threshold=V` replays each.
	for _, row := range [][]string{{"75%", "70%"}, {"95%", "80%"}} {
		if !slices.ContainsFunc(strings.Split(out.String(), "\n"), func(l string) bool {
			f := strings.Fields(l)
			return len(f) > 2 && f[0] == row[0] && f[1] == row[1]
		}) {
			t.Errorf("sweep has no row high %s low %s", row[0], row[1])
		}
	}
}

func TestParseSweep(t *testing.T) {
	for in, want := range map[string]string{
		FlagHigh + "=80..90:5":     "80 85 90",
		FlagLow + "=70..72":        "70 71 72",
		FlagMinAge + "=0s..1h:30m": "0s 30m0s 1h0m0s",
		FlagMaxAge + "=1h..3h:1h":  "1h0m0s 2h0m0s 3h0m0s",
	} {
		sw, err := ParseSweep(in)
		if err != nil || strings.Join(sw.Values, " ") != want {
			t.Errorf("%s: %v %v, want %s", in, sw.Values, err, want)
		}
	}
	for _, bad := range []string{"nope", FlagHigh + "=90..80", FlagHigh + "=80..101", FlagMinAge + "=0s..1h",
		"keep-image=a..b", FlagHigh + "=1..100:0"} {
		if _, err := ParseSweep(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestCommandSkipsWhatAStateFileCannotRead (issue 40, item 8): replay
// from a state file whose trace holds a chunk that does not decode
// replays the rest and says on stderr what it skipped. On d7dd547 it
// failed: "read the trace: trace chunk 2: format 9".
func TestCommandSkipsWhatAStateFileCannotRead(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := trace.Open(db, trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := tracegen.Generate(smallBusyNode())
	if err := l.Put(recs[:len(recs)/2]...); err != nil {
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
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put(recs[len(recs)/2:]...); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := Command(context.Background(), CommandOptions{Source: trace.Source{StateDir: dir}}, &out, &errOut); err != nil {
		t.Fatalf("replay of a state file with a damaged chunk: %v", err)
	}
	if !strings.Contains(errOut.String(), "1 chunks and 0 records of the stored trace could not be read and were skipped") ||
		!strings.Contains(errOut.String(), "format 9") {
		t.Errorf("stderr %q: want what was skipped", errOut.String())
	}
	if !strings.Contains(out.String(), "deletions") {
		t.Errorf("no replay printed:\n%s", out.String())
	}
}
