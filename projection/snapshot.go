package projection

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A snapshot is binary: snapshotMagic, a table of every distinct string
// once, then the records, whose strings are indexes into the table. A busy
// node's projection repeats the same digests, names and pod ids across
// tens of thousands of records: the table makes the file a fraction of its
// JSON, decoding several times faster, and the restored strings shared as
// they were before the restart. Snapshots written as JSON by older agents
// are still read, and so are snapshots of format 2 (before regrets: no
// deletions after the pods) and 3 (before pod log dirs: nothing after the
// deletions).
var (
	snapshotMagic   = []byte("gcagent-snapshot-4\n")
	snapshotMagicV3 = []byte("gcagent-snapshot-3\n")
	snapshotMagicV2 = []byte("gcagent-snapshot-2\n")
)

// encodeSnapshot returns s in the snapshot format.
func encodeSnapshot(s *State) []byte {
	var z snapSizes
	return z.encode(s)
}

// snapSizes are the sizes of the last snapshot a Store encoded: the next
// one is about as large, and its buffers and string index are made that
// size at once instead of grown (each growth leaves the old copy as
// garbage, megabytes at a busy node's size).
type snapSizes struct {
	strings, table, body int
}

// encode returns s in the snapshot format and records its sizes. The
// string table is written in place, behind room for the header, and the
// records after it: the snapshot is never copied whole.
func (z *snapSizes) encode(s *State) []byte {
	if z.strings == 0 { // no snapshot yet: what a busy node's records take
		records := len(s.Images) + len(s.Containers) + len(s.Pods) + len(s.Deletions)
		z.strings, z.table, z.body = 4*records, 224*records, 56*records
	}
	head := len(snapshotMagic) + 2*binary.MaxVarintLen64
	w := snapWriter{index: make(map[string]uint64, z.strings+z.strings/8),
		table: make([]byte, head, head+z.table+z.table/8+z.body+z.body/8), body: make([]byte, 0, z.body+z.body/8)}
	w.index[""] = 0
	w.bool(s.Synced)
	w.uint(s.Seq)
	w.str(s.Namespace)
	w.uint(uint64(len(s.Images)))
	for _, img := range s.Images {
		w.str(img.Digest)
		w.uint(uint64(len(img.Names)))
		for _, n := range img.Names {
			w.str(n.Name)
			w.uint(uint64(len(n.Labels)))
			for k, v := range n.Labels {
				w.str(k)
				w.str(v)
			}
		}
		w.int(img.Size)
		w.time(img.Created.Time())
		w.time(img.FirstSeen.Time())
		w.time(img.LastUsed.Time())
		w.str(img.ConfigDigest)
		w.str(img.ChainID)
	}
	w.uint(uint64(len(s.Containers)))
	for _, c := range s.Containers {
		for _, v := range []string{c.ID, c.Image, c.ImageDigest, c.CRIKind, c.PodUID, c.PodName, c.PodNamespace,
			c.ContainerName, c.SandboxID, c.State.String(), c.ImageID, c.RootChain, c.RootKey.String()} {
			w.str(v)
		}
		for _, t := range []Stamp{c.Created, c.FirstSeen, c.StartedAt, c.ExitedAt, c.CollectedAt, c.LastOpAt} {
			w.time(t.Time())
		}
		w.uint(uint64(c.Pid))
		w.uint(uint64(c.ExitStatus))
		w.strs(c.VolumeImageIDs())
		w.strs(c.VolumeChains())
		w.bool(c.RestartManaged)
	}
	w.uint(uint64(len(s.Pods)))
	for _, p := range s.Pods {
		w.str(p.UID)
		w.str(p.Name)
		w.str(p.Namespace)
		w.uint(uint64(len(p.Sandboxes)))
		for id := range p.Sandboxes {
			w.str(id)
		}
		w.time(p.FirstSeen)
		w.time(p.GoneAt)
	}
	// Deletions come last: a snapshot of an agent before regrets ends
	// after the pods.
	w.uint(uint64(len(s.Deletions)))
	for _, d := range s.Deletions {
		w.str(d.Digest)
		w.strs(d.Names)
		w.int(d.Size)
		w.int(d.Freed)
		w.str(d.Rule)
		w.str(d.Trigger)
		w.str(d.ReturnedAs)
		for _, t := range []time.Time{d.At, d.Until, d.ReturnedAt} {
			w.time(t)
		}
	}
	// The pods' log dirs come after the deletions: a snapshot of format 3
	// ends before them.
	var logDirs []*Pod
	for _, p := range s.Pods {
		if p.LogDir != "" {
			logDirs = append(logDirs, p)
		}
	}
	w.uint(uint64(len(logDirs)))
	for _, p := range logDirs {
		w.str(p.UID)
		w.str(p.LogDir)
	}

	z.strings, z.table, z.body = len(w.index), len(w.table)-head, len(w.body)
	hdr := append(append([]byte{}, snapshotMagic...), binary.AppendUvarint(nil, uint64(len(w.index)-1))...)
	hdr = binary.AppendUvarint(hdr, uint64(z.table))
	out := append(w.table, w.body...)[head-len(hdr):]
	copy(out, hdr)
	return out
}

// decodeSnapshot reads a snapshot in either format; the state is not yet
// filled (see fill).
func decodeSnapshot(b []byte) (*State, error) {
	s := New()
	v2, v3 := bytes.HasPrefix(b, snapshotMagicV2), bytes.HasPrefix(b, snapshotMagicV3)
	if !v2 && !v3 && !bytes.HasPrefix(b, snapshotMagic) {
		if err := json.Unmarshal(b, s); err != nil {
			return nil, err
		}
		return s, nil
	}
	r := snapReader{b: b[len(snapshotMagic):]} // every magic has one length
	r.table()
	s.Synced = r.bool()
	s.Seq = r.uint()
	s.Namespace = r.str()
	for n := r.count(); n > 0 && r.err == nil; n-- {
		img := &Image{Digest: r.str()}
		for m := r.count(); m > 0 && r.err == nil; m-- {
			name := r.str()
			var labels map[string]string
			if k := r.count(); k > 0 {
				labels = make(map[string]string, k)
				for ; k > 0 && r.err == nil; k-- {
					key := r.str()
					labels[key] = r.str()
				}
			}
			img.Names = append(img.Names, ImageName{name, labels})
		}
		img.Names = img.Names.sorted() // older snapshots wrote a map's order
		img.Size = r.int()
		img.Created, img.FirstSeen, img.LastUsed = StampOf(r.time()), StampOf(r.time()), StampOf(r.time())
		img.ConfigDigest, img.ChainID = r.str(), r.str()
		s.Images[img.Digest] = img
	}
	for n := r.count(); n > 0 && r.err == nil; n-- {
		c, state := &Container{}, ""
		for _, dst := range []*string{&c.ID, &c.Image, &c.ImageDigest, &c.CRIKind, &c.PodUID, &c.PodName, &c.PodNamespace,
			&c.ContainerName, &c.SandboxID, &state, &c.ImageID, &c.RootChain} {
			*dst = r.str()
		}
		if st, ok := parseState(state); ok {
			c.State = st
		} else {
			r.fail(fmt.Errorf("container %q: unknown state %q", c.ID, state))
		}
		c.RootKey = parseUseKey(r.str())
		for _, dst := range []*Stamp{&c.Created, &c.FirstSeen, &c.StartedAt, &c.ExitedAt, &c.CollectedAt, &c.LastOpAt} {
			*dst = StampOf(r.time())
		}
		c.Pid, c.ExitStatus = uint32(r.uint()), uint32(r.uint())
		c.setVolumes(r.strs(), r.strs())
		c.RestartManaged = r.bool()
		s.Containers[c.ID] = c
	}
	for n := r.count(); n > 0 && r.err == nil; n-- {
		p := &Pod{UID: r.str(), Name: r.str(), Namespace: r.str(), Sandboxes: map[string]struct{}{}}
		for m := r.count(); m > 0 && r.err == nil; m-- {
			p.Sandboxes[r.str()] = struct{}{}
		}
		p.FirstSeen, p.GoneAt = r.time(), r.time()
		s.Pods[p.UID] = p
	}
	if !v2 {
		for n := r.count(); n > 0 && r.err == nil; n-- {
			d := &Deletion{Digest: r.str(), Names: r.strs(), Size: r.int(), Freed: r.int(), Rule: r.str(), Trigger: r.str(), ReturnedAs: r.str()}
			d.At, d.Until, d.ReturnedAt = r.time(), r.time(), r.time()
			s.Deletions[d.Digest] = d
		}
	}
	if !v2 && !v3 {
		for n := r.count(); n > 0 && r.err == nil; n-- {
			uid, dir := r.str(), r.str()
			if p := s.Pods[uid]; p != nil {
				p.LogDir = dir
			} else if r.err == nil {
				r.fail(fmt.Errorf("log dir of pod %q, which is in no record", uid))
			}
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after the last record", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("snapshot: %w", r.err)
	}
	return s, nil
}

// snapWriter appends records to body and each distinct string, once, to
// table.
type snapWriter struct {
	index       map[string]uint64 // string -> its number; "" is 0 and not in table
	table, body []byte
}

func (w *snapWriter) uint(v uint64) { w.body = binary.AppendUvarint(w.body, v) }
func (w *snapWriter) int(v int64)   { w.body = binary.AppendVarint(w.body, v) }

func (w *snapWriter) bool(v bool) {
	if v {
		w.uint(1)
	} else {
		w.uint(0)
	}
}

func (w *snapWriter) str(s string) {
	i, ok := w.index[s]
	if !ok {
		i = uint64(len(w.index))
		w.index[s] = i
		w.table = binary.AppendUvarint(w.table, uint64(len(s)))
		w.table = append(w.table, s...)
	}
	w.uint(i)
}

// strs writes a list, telling nil from empty (the reducer does).
func (w *snapWriter) strs(l []string) {
	if l == nil {
		w.uint(0)
		return
	}
	w.uint(uint64(len(l)) + 1)
	for _, s := range l {
		w.str(s)
	}
}

// time writes t to the nanosecond, in UTC (the projection's times are);
// the zero time is one byte.
func (w *snapWriter) time(t time.Time) {
	if t.IsZero() {
		w.uint(0)
		return
	}
	w.uint(1)
	w.int(t.Unix())
	w.uint(uint64(t.Nanosecond()))
}

// snapReader reads what snapWriter wrote; the first error sticks and every
// later read returns zero values.
type snapReader struct {
	b       []byte
	strings []string
	err     error
}

var errSnapshotShort = errors.New("truncated")

// table reads the string table into one string that every entry slices:
// one allocation for all of them, kept while any restored record is (at
// most the size of the table, megabytes for a busy node).
func (r *snapReader) table() {
	n, size := r.uint(), r.uint()
	if r.err != nil {
		return
	}
	if size > uint64(len(r.b)) || n > size { // each entry takes two bytes or more
		r.fail(fmt.Errorf("string table of %d bytes, %d strings, with %d bytes left", size, n, len(r.b)))
		return
	}
	tab := r.b[:size]
	r.b = r.b[size:]
	all := string(tab)
	r.strings = make([]string, 1, n+1) // 0 is ""
	off := 0
	for uint64(len(r.strings)) <= n {
		l, k := binary.Uvarint(tab[off:])
		if k <= 0 || l > uint64(len(tab)-off-k) {
			r.fail(errSnapshotShort)
			return
		}
		off += k
		r.strings = append(r.strings, all[off:off+int(l)])
		off += int(l)
	}
	if off != len(tab) {
		r.fail(fmt.Errorf("%d bytes after the string table's last entry", len(tab)-off))
	}
}

func (r *snapReader) uint() uint64 { return readVarint(r, binary.Uvarint) }
func (r *snapReader) int() int64   { return readVarint(r, binary.Varint) }

// readVarint reads one number with read (binary.Uvarint or Varint).
func readVarint[T uint64 | int64](r *snapReader, read func([]byte) (T, int)) T {
	if r.err != nil {
		return 0
	}
	v, k := read(r.b)
	if k <= 0 {
		r.err = errSnapshotShort
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *snapReader) bool() bool { return r.uint() != 0 }

// count reads a number of records, each at least one byte: a count larger
// than what is left is corrupt (and must not size an allocation).
func (r *snapReader) count() int {
	n := r.uint()
	if n > uint64(len(r.b)) {
		r.fail(fmt.Errorf("count %d with %d bytes left", n, len(r.b)))
		return 0
	}
	return int(n)
}

func (r *snapReader) str() string {
	i := r.uint()
	if i >= uint64(len(r.strings)) {
		r.fail(fmt.Errorf("string %d of %d", i, len(r.strings)))
		return ""
	}
	return r.strings[i]
}

func (r *snapReader) strs() []string {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]string, n-1)
	for i := range out {
		out[i] = r.str()
	}
	return out
}

func (r *snapReader) time() time.Time {
	if !r.bool() {
		return time.Time{}
	}
	sec, ns := r.int(), r.uint()
	if ns >= uint64(time.Second) {
		r.fail(fmt.Errorf("%d nanoseconds", ns))
	}
	if r.err != nil {
		return time.Time{}
	}
	return time.Unix(sec, int64(ns)).UTC()
}

func (r *snapReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}
