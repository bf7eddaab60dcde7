package trace

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// The trace's buckets in the state file: chunks of records by sequence,
// and the base (the images present at the window's start).
var (
	bucketChunks = []byte("trace")
	bucketBase   = []byte("trace.base")
	keyBase      = []byte("base")
)

// A chunk's value: a format byte, the time of its last record (8 bytes,
// Unix nanoseconds, big-endian), then JSON lines, deflated or not.
const (
	formatPlain    byte = 0
	formatDeflated byte = 1
	chunkHeader         = 9
)

// Defaults of Options.
const (
	DefaultMaxAge   = 30 * 24 * time.Hour
	DefaultMaxBytes = 16 << 20
	// mergeChunks is how many small plain chunks (disk measurements,
	// policies) make a compaction due.
	mergeChunks = 1024
)

// Options bound a Log.
type Options struct {
	// MaxAge is how long records are kept before they are folded into
	// the base. Default DefaultMaxAge.
	MaxAge time.Duration
	// MaxBytes bounds the stored trace (chunks and base); the oldest
	// chunks are folded into the base when it is over. Default
	// DefaultMaxBytes.
	MaxBytes int64
	// Metrics count the records refused and the chunks dropped (nil:
	// not counted).
	Metrics *Metrics
	// Log says, once each, the first record refused and each chunk a
	// compaction dropped (the zero Logger logs nothing).
	Log zerolog.Logger
}

// Log is the trace in the state file (a bbolt database it shares with the
// projection). Records are added in the caller's transaction (PutTx: the
// journal's, so a record is durable exactly when the event that made it
// is) or in one of their own (Put). Compact merges and bounds them. Its
// methods are safe for concurrent use.
type Log struct {
	db *bolt.DB
	o  Options

	fresh   bool         // the file held no trace when the Log was opened
	plain   atomic.Int64 // plain chunks since the last merge
	refused atomic.Bool  // a refused record has been logged
	// compacting serializes compactions. It is never held while waiting
	// for what the projection holds: PutTx runs inside the journal's
	// transaction, so nothing it takes may be held by a caller of
	// db.Update.
	compacting sync.Mutex

	mu        sync.Mutex // the fields below
	lastDisk  Disk       // the last disk measurement recorded
	lastDiskT time.Time
	policy    *Policy // the last policy recorded
}

// Open returns the trace of db, creating its buckets. The trace is fresh
// (Fresh) when the file held none.
func Open(db *bolt.DB, o Options) (*Log, error) {
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	l := &Log{db: db, o: o}
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketChunks)
		if err != nil {
			return err
		}
		base, err := tx.CreateBucketIfNotExists(bucketBase)
		if err != nil {
			return err
		}
		l.fresh = base.Get(keyBase) == nil && b.Stats().KeyN == 0
		return b.ForEach(func(_, v []byte) error {
			if len(v) > 0 && v[0] == formatPlain {
				l.plain.Add(1)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	return l, nil
}

// Fresh reports whether the file held no trace when the Log was opened:
// the images already present must then be recorded as a base.
func (l *Log) Fresh() bool { return l.fresh }

// PutTx adds recs as one chunk in tx, a writable transaction of the Log's
// database. The projection adds the records of its events in batches
// (a thousand, or a minute's), in the journal's transactions. A record
// the trace's reader would refuse (no time or kind, not encodable, too
// long) is left out, counted, and the first one logged: it never fails
// the transaction, nor is it stored to fail every later read.
func (l *Log) PutTx(tx *bolt.Tx, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	b := tx.Bucket(bucketChunks)
	if b == nil {
		return errors.New("trace: no bucket")
	}
	deflate := len(recs) >= deflateRecords
	v, n, err := encodeChunk(recs, deflate, l.refuse)
	if err != nil || n == 0 {
		return err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	if err := b.Put(seqKey(seq), v); err != nil {
		return err
	}
	if !deflate {
		l.plain.Add(1)
	}
	return nil
}

// deflateRecords is the least records a chunk is deflated for when it is
// written; smaller ones are merged later (Compact).
const deflateRecords = 32

// Put adds recs as one chunk in a transaction of its own.
func (l *Log) Put(recs ...Record) error {
	return l.db.Update(func(tx *bolt.Tx) error { return l.PutTx(tx, recs) })
}

// diskEvery is the least spacing of disk records that only follow usage.
const diskEvery = time.Second

// Disk records a measurement of the image filesystem taken at t: always
// when trigger is set (the start of an image GC pass), else when the
// capacity changed or the usage moved by a percent, at most once a second.
// It reports whether it recorded one.
func (l *Log) Disk(t time.Time, d Disk, trigger string) (bool, error) {
	l.mu.Lock()
	due := trigger != "" || l.lastDiskT.IsZero() || d.Capacity != l.lastDisk.Capacity ||
		d.Usage() != l.lastDisk.Usage() && t.Sub(l.lastDiskT) >= diskEvery
	if due {
		l.lastDisk, l.lastDiskT = d, t
	}
	l.mu.Unlock()
	if !due {
		return false, nil
	}
	return true, l.Put(Record{T: t, Ev: KindDisk, Disk: &d, Trigger: trigger})
}

// Policy records the image GC policy in force from t on, unless it is the
// one recorded last.
func (l *Log) Policy(t time.Time, p Policy) error {
	l.mu.Lock()
	same := l.policy != nil && l.policy.Equal(p)
	if !same {
		l.policy = &p
	}
	l.mu.Unlock()
	if same {
		return nil
	}
	return l.Put(Record{T: t, Ev: KindPolicy, Policy: &p})
}

// refuse counts a record the writer refused, and logs the first.
func (l *Log) refuse(r *Record, why error) {
	l.o.Metrics.refuse()
	if l.refused.CompareAndSwap(false, true) {
		l.o.Log.Warn().Str("kind", string(r.Ev)).Time("t", r.T).Str("digest", r.Digest).Err(why).
			Msg("usage trace: a record its reader would refuse is not stored (further ones are only counted: gcagent_trace_records_refused_total)")
	}
}

// CompactDue reports whether enough chunks were added since the last
// compaction to merge them.
func (l *Log) CompactDue() bool { return l.plain.Load() >= mergeChunks }

// Compact merges the plain chunks into one deflated chunk, then folds the
// chunks whose records are all older than MaxAge before now into the
// base, and the oldest ones while the trace is over MaxBytes. A chunk
// (or the base) that does not decode is dropped, and a record in one
// that the reader refuses left out: the bounds hold whatever the trace
// holds. What it dropped is counted and logged once, when the
// transaction is done. One transaction; a failure changes nothing.
func (l *Log) Compact(now time.Time) error {
	l.compacting.Lock()
	defer l.compacting.Unlock()
	merged := l.plain.Load()
	var drops damage
	err := l.db.Update(func(tx *bolt.Tx) error {
		drops = damage{}
		b, bb := tx.Bucket(bucketChunks), tx.Bucket(bucketBase)
		if b == nil || bb == nil {
			return errors.New("trace: no bucket")
		}
		if err := mergePlain(b, &drops, l.refuse); err != nil {
			return err
		}
		return prune(b, bb, now.Add(-l.o.MaxAge), l.o.MaxBytes, &drops, l.refuse)
	})
	if err != nil {
		return fmt.Errorf("compact trace: %w", err)
	}
	l.plain.Add(-merged) // chunks put meanwhile wait for the next merge
	l.o.Metrics.drop(drops.Skipped)
	for _, c := range drops.chunks {
		l.o.Log.Warn().Str("chunk", c.where).Int("size_bytes", c.size).Err(c.err).Msg("usage trace: a chunk that does not decode is dropped")
	}
	if drops.Records > 0 {
		l.o.Log.Warn().Int("records", drops.Records).Str("first", drops.First).Msg("usage trace: records that do not decode are dropped")
	}
	return nil
}

// damage is what a compaction dropped: counted as a read's Skipped, and
// each chunk for its log line.
type damage struct {
	Skipped
	chunks []droppedChunk
}

type droppedChunk struct {
	where string
	size  int
	err   error
}

// chunk drops the undecodable chunk k of b (where names it).
func (d *damage) chunk(b *bolt.Bucket, k []byte, where string, size int, err error) error {
	d.Skipped.chunk(where, err)
	d.chunks = append(d.chunks, droppedChunk{where, size, err})
	return b.Delete(k)
}

// decode decodes chunk v (where names it), leaving out the records the
// reader refuses (noted in d); an error when the chunk does not decode.
func (d *damage) decode(v []byte, where string) ([]Record, error) {
	return decodeChunk(v, func(line int, err error) { d.record(where, line, err) })
}

// mergePlain deflates every plain chunk into one, under the first one's
// key; one that does not decode is dropped (d).
func mergePlain(b *bolt.Bucket, d *damage, refuse func(*Record, error)) error {
	var first []byte
	var recs []Record
	var keys, bad [][]byte
	var errs []error
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(v) == 0 || v[0] != formatPlain {
			continue
		}
		rs, err := d.decode(v, chunkName(k))
		if err != nil {
			bad, errs = append(bad, bytes.Clone(k)), append(errs, err)
			continue
		}
		if first == nil {
			first = bytes.Clone(k)
		}
		recs = append(recs, rs...)
		keys = append(keys, bytes.Clone(k))
	}
	for i, k := range bad {
		if err := d.chunk(b, k, chunkName(k), len(b.Get(k)), errs[i]); err != nil {
			return err
		}
	}
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	v, n, err := encodeChunk(recs, true, refuse)
	if err != nil || n == 0 {
		return err
	}
	return b.Put(first, v)
}

// prune folds into the base the oldest chunks whose last record is before
// cutoff, then the oldest while chunks and base together are over max
// bytes (the newest chunk always stays). A chunk without a header is
// dropped at once (d); one that does not decode when folded, and a base
// that does not, are dropped.
func prune(b, bb *bolt.Bucket, cutoff time.Time, maxBytes int64, d *damage, refuse func(*Record, error)) error {
	total := int64(len(bb.Get(keyBase)))
	type chunk struct {
		k    []byte
		size int64
		last time.Time
	}
	var chunks []chunk
	var short [][]byte
	err := b.ForEach(func(k, v []byte) error {
		if len(v) < chunkHeader {
			short = append(short, bytes.Clone(k))
			return nil
		}
		chunks = append(chunks, chunk{bytes.Clone(k), int64(len(v)), lastOf(v)})
		total += int64(len(v))
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range short {
		n := len(b.Get(k))
		if err := d.chunk(b, k, chunkName(k), n, fmt.Errorf("%d bytes: no header", n)); err != nil {
			return err
		}
	}
	var fold []chunk
	for len(chunks) > 1 && (chunks[0].last.Before(cutoff) || total > maxBytes) {
		fold = append(fold, chunks[0])
		total -= chunks[0].size
		chunks = chunks[1:]
	}
	if len(fold) == 0 {
		return nil
	}
	var base []Record
	if v := bb.Get(keyBase); v != nil {
		if base, err = d.decode(v, "base"); err != nil {
			if err := d.chunk(bb, keyBase, "base", len(v), err); err != nil {
				return err
			}
			base = nil // the images present before the window are lost, the bounds kept
		}
	}
	var recs []Record
	for _, c := range fold {
		rs, err := d.decode(b.Get(c.k), chunkName(c.k))
		if err != nil {
			if err := d.chunk(b, c.k, chunkName(c.k), int(c.size), err); err != nil {
				return err
			}
			continue
		}
		recs = append(recs, rs...)
		if err := b.Delete(c.k); err != nil {
			return err
		}
	}
	v, n, err := encodeChunk(Fold(base, recs, time.Time{}), true, refuse)
	if err != nil {
		return err
	}
	if n == 0 {
		return bb.Delete(keyBase)
	}
	return bb.Put(keyBase, v)
}

func chunkName(k []byte) string {
	if len(k) != 8 {
		return fmt.Sprintf("chunk %x", k)
	}
	return fmt.Sprintf("chunk %d", binary.BigEndian.Uint64(k))
}

// Read calls fn with every stored record it can read: the base, then the
// chunks in the order they were written (not sorted by time, and with
// removals as stored: see Canonical). A chunk that does not decode, and
// a record the reader refuses, are skipped; the Skipped it returns says
// what. It works on a read-only database too.
func Read(db *bolt.DB, fn func(Record) error) (Skipped, error) {
	var skipped Skipped
	err := db.View(func(tx *bolt.Tx) error {
		b, bb := tx.Bucket(bucketChunks), tx.Bucket(bucketBase)
		if b == nil || bb == nil {
			return nil // no trace
		}
		each := func(v []byte, where string) error {
			rs, err := decodeChunk(v, func(line int, err error) { skipped.record(where, line, err) })
			if err != nil {
				skipped.chunk(where, err)
				return nil
			}
			for _, r := range rs {
				if err := fn(r); err != nil {
					return err
				}
			}
			return nil
		}
		if v := bb.Get(keyBase); v != nil {
			if err := each(v, "base"); err != nil {
				return err
			}
		}
		return b.ForEach(func(k, v []byte) error { return each(v, chunkName(k)) })
	})
	return skipped, err
}

// Size returns the bytes the stored trace takes (chunks and base, values
// only) and how many chunks it has.
func Size(db *bolt.DB) (n int64, chunks int, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		if bb := tx.Bucket(bucketBase); bb != nil {
			n += int64(len(bb.Get(keyBase)))
		}
		if b := tx.Bucket(bucketChunks); b != nil {
			return b.ForEach(func(_, v []byte) error {
				n += int64(len(v))
				chunks++
				return nil
			})
		}
		return nil
	})
	return n, chunks, err
}

// encodeChunk encodes recs as a chunk, leaving out (and telling refuse
// of) each record the reader would refuse; n is how many it holds.
func encodeChunk(recs []Record, deflate bool, refuse func(*Record, error)) (v []byte, n int, err error) {
	head := make([]byte, chunkHeader, 256)
	body := head
	if deflate {
		body = make([]byte, 0, 256)
	}
	var last time.Time
	for i := range recs {
		r := &recs[i]
		start := len(body)
		var viaJSON bool
		body, viaJSON, err = appendLine(body, r)
		if err == nil {
			err = readable(r, body[start:len(body)-1], viaJSON)
		}
		if err != nil {
			body = body[:start]
			if refuse != nil {
				refuse(r, err)
			}
			continue
		}
		n++
		if r.T.After(last) {
			last = r.T
		}
	}
	if !deflate {
		head = body[:chunkHeader] // body grew from head: the header is its start
	}
	if !last.IsZero() {
		binary.BigEndian.PutUint64(head[1:], uint64(last.UnixNano()))
	}
	if !deflate {
		head[0] = formatPlain
		return body, n, nil
	}
	head[0] = formatDeflated
	buf := bytes.NewBuffer(head)
	zw, _ := deflaters.Get().(*flate.Writer)
	if zw == nil {
		if zw, err = flate.NewWriter(buf, flate.DefaultCompression); err != nil {
			return nil, 0, err
		}
	} else {
		zw.Reset(buf)
	}
	defer deflaters.Put(zw)
	if _, err := zw.Write(body); err != nil {
		return nil, 0, err
	}
	if err := zw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), n, nil
}

// deflaters keeps flate writers (a megabyte of tables each) for reuse.
var deflaters sync.Pool

// decodeChunk returns the records of a stored chunk. A line the reader
// refuses is passed to bad (nil: an error); a chunk without a header, of
// an unknown format, whose deflate stream is broken or with a line too
// long for the reader is an error.
func decodeChunk(v []byte, bad func(line int, err error)) ([]Record, error) {
	if len(v) < chunkHeader {
		return nil, fmt.Errorf("%d bytes: no header", len(v))
	}
	var r io.Reader = bytes.NewReader(v[chunkHeader:])
	switch v[0] {
	case formatPlain:
	case formatDeflated:
		zr := flate.NewReader(r)
		defer zr.Close()
		r = zr
	default:
		return nil, fmt.Errorf("format %d", v[0])
	}
	var out []Record
	err := Decode(r, func(rec Record) error { out = append(out, rec); return nil }, bad)
	return out, err
}

func lastOf(v []byte) time.Time {
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[1:chunkHeader]))).UTC()
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

// Kept reports whether the database of tx keeps a trace.
func Kept(tx *bolt.Tx) bool { return tx.Bucket(bucketChunks) != nil }
