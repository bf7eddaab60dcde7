package projection

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// fullState has every persisted field of every record set to a value of
// its own, so a codec that drops or swaps a field fails the round trip.
func fullState(t *testing.T) *State {
	s := New()
	s.Synced, s.Seq, s.Namespace = true, 42, "buildkit"
	s.Images["sha256:i1"] = &Image{Digest: "sha256:i1",
		Names: ImageNames{{"a:1", map[string]string{LabelPinned: LabelPinnedValue, LabelCRIManaged: "managed"}}, {"a:2", nil}},
		Size:  -7, Created: StampOf(at(1).Add(3)), FirstSeen: StampOf(at(2)), LastUsed: StampOf(at(3)), ConfigDigest: "sha256:cfg", ChainID: "sha256:chain"}
	s.Containers["c1"] = &Container{ID: "c1", Image: "a:1", ImageDigest: "sha256:i1", CRIKind: KindContainer, PodUID: "uid",
		PodName: "pod", PodNamespace: "ns", ContainerName: "app", SandboxID: "sb", Created: StampOf(at(4)), FirstSeen: StampOf(at(5)),
		State: StateExited, Pid: 99, StartedAt: StampOf(at(6)), ExitedAt: StampOf(at(7).Add(time.Nanosecond)), ExitStatus: 137,
		ImageID: "sha256:cfg", RootChain: "sha256:chain", RootKey: configKey("sha256:cfg"), RestartManaged: true,
		CollectedAt: StampOf(at(8)), LastOpAt: StampOf(at(9))}
	s.Containers["c1"].setVolumes([]string{"sha256:v1", "sha256:v2"}, []string{"sha256:vc"})                   // unexported: set by hand
	s.Containers["c2"] = &Container{ID: "c2", State: StateCreated, FirstSeen: StampOf(time.Unix(-5, 0).UTC())} // nil lists, zero times
	s.Pods["uid"] = &Pod{UID: "uid", Name: "pod", Namespace: "ns", Sandboxes: map[string]struct{}{"sb": {}, "sb2": {}},
		LogDir: "/var/log/pods/ns_pod_uid", FirstSeen: at(10), GoneAt: at(11)}
	s.Deletions["sha256:gone"] = &Deletion{Digest: "sha256:gone", Names: []string{"b:1", "sha256:bcfg"}, Size: 5 << 20, Freed: 6 << 20,
		Rule: "space", Trigger: "disk", At: at(12), Until: at(12).Add(24 * time.Hour), ReturnedAt: at(13), ReturnedAs: "b:1"}
	for _, v := range []any{*s.Images["sha256:i1"], *s.Containers["c1"], *s.Pods["uid"], *s.Deletions["sha256:gone"]} {
		rv := reflect.ValueOf(v)
		for i := range rv.NumField() {
			if f := rv.Type().Field(i); f.IsExported() && f.Tag.Get("json") != "-" && rv.Field(i).IsZero() {
				t.Fatalf("%s.%s is zero: give it a value (and the snapshot codec the field)", rv.Type().Name(), f.Name)
			}
		}
	}
	s.fill()
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	want := fullState(t)
	got, err := decodeSnapshot(encodeSnapshot(want))
	if err != nil {
		t.Fatal(err)
	}
	got.fill()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("round trip differs\nwant %+v\ngot  %+v", want, got)
	}
	// A restored root key shares its container's string: no copy of its own.
	if c := got.Containers["c1"]; unsafe.StringData(c.RootKey.v) != unsafe.StringData(c.ImageID) {
		t.Errorf("restored root key %v holds a string of its own", c.RootKey)
	}
	empty, err := decodeSnapshot(encodeSnapshot(New()))
	if err != nil || len(empty.Images)+len(empty.Containers)+len(empty.Pods) != 0 || empty.Seq != 0 {
		t.Fatalf("empty state: %+v %v", empty, err)
	}
}

// TestSnapshotSizes: a snapshot encoded with the sizes of the one before
// is the same snapshot, whether its buffers were made too small (they
// grow) or too large, and records its sizes for the next.
func TestSnapshotSizes(t *testing.T) {
	want := fullState(t)
	for name, z := range map[string]snapSizes{"none yet": {}, "too small": {1, 1, 1}, "larger": {1000, 1 << 20, 1 << 20}} {
		got, err := decodeSnapshot(z.encode(want))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got.fill()
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s: round trip differs\nwant %+v\ngot  %+v", name, want, got)
		}
		if z.strings < 10 || z.table < 10*len("sha256:") || z.body < 50 {
			t.Errorf("%s: sizes %+v recorded", name, z)
		}
	}
}

// TestSnapshotReadsJSON: a state file written by an agent before the
// binary snapshot (JSON) is restored whole.
func TestSnapshotReadsJSON(t *testing.T) {
	want := fullState(t)
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	old, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySnapshot, old) }); err != nil {
		t.Fatal(err)
	}
	res, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	want.Synced = false // a restored state waits for a reconcile
	if !reflect.DeepEqual(want, res.State) {
		t.Fatalf("JSON snapshot restored differently\nwant %+v\ngot  %+v", want, res.State)
	}
	// The next snapshot is binary, and restores the same.
	if err := st.Snapshot(res.State); err != nil {
		t.Fatal(err)
	}
	st.loaded = nil
	again, err := st.Load()
	if err != nil || !reflect.DeepEqual(want, again.State) {
		t.Fatalf("binary snapshot restored differently: %v", err)
	}
}

// TestSnapshotReadsFormat2: a snapshot of an agent before regrets (no
// deletions after the pods) is restored whole.
func TestSnapshotReadsFormat2(t *testing.T) {
	want := fullState(t)
	want.Deletions = map[string]*Deletion{}
	want.Pods["uid"].LogDir = ""
	b := encodeSnapshot(want)
	old := append(append([]byte(nil), snapshotMagicV2...), b[len(snapshotMagic):len(b)-2]...) // without the counts of deletions and log dirs
	got, err := decodeSnapshot(old)
	if err != nil {
		t.Fatal(err)
	}
	got.fill()
	want.fill()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("format 2 differs\nwant %+v\ngot  %+v", want, got)
	}
}

// TestSnapshotReadsFormat3: a snapshot of an agent before pod log dirs
// (nothing after the deletions) is restored whole, its pods without one.
func TestSnapshotReadsFormat3(t *testing.T) {
	want := fullState(t)
	want.Pods["uid"].LogDir = ""
	b := encodeSnapshot(want)
	old := append(append([]byte(nil), snapshotMagicV3...), b[len(snapshotMagic):len(b)-1]...) // without the count of log dirs
	got, err := decodeSnapshot(old)
	if err != nil {
		t.Fatal(err)
	}
	got.fill()
	want.fill()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("format 3 differs\nwant %+v\ngot  %+v", want, got)
	}
}

// TestSnapshotCorrupt: every truncation and a flipped byte fail with an
// error (the store then resets), never a panic or a huge allocation.
func TestSnapshotCorrupt(t *testing.T) {
	b := encodeSnapshot(fullState(t))
	for n := len(snapshotMagic); n < len(b); n++ {
		if _, err := decodeSnapshot(b[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(b))
		}
	}
	for i := len(snapshotMagic); i < len(b); i++ {
		bad := append([]byte(nil), b...)
		bad[i] ^= 0xff
		_, _ = decodeSnapshot(bad) // may decode to other values; must not panic
	}
	if _, err := decodeSnapshot(append(append([]byte(nil), snapshotMagic...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1)); err == nil {
		t.Fatal("a string table larger than the file: no error")
	}
}

// BenchmarkSnapshot encodes and decodes the projection of a busy node
// (busyNode) as a binary snapshot and as the JSON older agents wrote, side
// by side, and reports each one's size.
func BenchmarkSnapshot(b *testing.B) {
	s := busyNode(10000)
	js, err := json.Marshal(s)
	if err != nil {
		b.Fatal(err)
	}
	bin := encodeSnapshot(s)
	for _, c := range []struct {
		name string
		enc  func() []byte
		data []byte
	}{
		{"binary", func() []byte { return encodeSnapshot(s) }, bin},
		{"json", func() []byte { b, _ := json.Marshal(s); return b }, js},
	} {
		b.Run(c.name+"/encode", func(b *testing.B) {
			for b.Loop() {
				c.enc()
			}
			b.ReportMetric(float64(len(c.data))/(1<<20), "MiB")
		})
		b.Run(c.name+"/decode", func(b *testing.B) {
			for b.Loop() {
				got, err := decodeSnapshot(c.data)
				if err != nil || len(got.Containers) != len(s.Containers) {
					b.Fatalf("%v, %d containers", err, len(got.Containers))
				}
				got.fill()
			}
		})
	}
}

// TestJSONFormUnchanged: the JSON an older agent wrote (names as an object
// of name to labels, a use key as its prefixed text) is what this one
// reads and writes, whatever the types in memory.
func TestJSONFormUnchanged(t *testing.T) {
	const old = `{"images":{"sha256:i1":{"digest":"sha256:i1","names":{"a:2":null,"a:1":{"io.cri-containerd.pinned":"pinned"}},` +
		`"size":1,"firstSeen":"2026-01-01T00:00:00Z","lastUsed":"0001-01-01T00:00:00Z"}},` +
		`"containers":{"c1":{"id":"c1","image":"a:1","imageDigest":"sha256:i1","firstSeen":"2026-01-01T00:00:00Z","state":"exited",` +
		`"exitStatus":0,"imageID":"sha256:cfg","rootKey":"config:sha256:cfg"}},"pods":{},"synced":true,"seq":3}`
	var s State
	if err := json.Unmarshal([]byte(old), &s); err != nil {
		t.Fatal(err)
	}
	img, c := s.Images["sha256:i1"], s.Containers["c1"]
	wantNames := ImageNames{{"a:1", map[string]string{LabelPinned: LabelPinnedValue}}, {"a:2", nil}}
	if !reflect.DeepEqual(img.Names, wantNames) || c.RootKey != configKey("sha256:cfg") {
		t.Fatalf("read names %+v, root key %+v", img.Names, c.RootKey)
	}
	b, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"names":{"a:1":{"io.cri-containerd.pinned":"pinned"},"a:2":null}`, `"rootKey":"config:sha256:cfg"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("written JSON lacks %s:\n%s", want, b)
		}
	}
}
