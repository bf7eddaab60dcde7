package projection

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/trace"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	bucketJournal = []byte("journal")  // big-endian seq -> events.Marshal
	bucketMeta    = []byte("meta")     // "snapshot" -> encodeSnapshot(State)
	keySnapshot   = []byte("snapshot") //
	// keyTraceSeq (in meta) is the last event whose trace records the
	// trace holds (big-endian seq).
	keyTraceSeq = []byte("traceSeq")
)

// Store persists a projection: a journal of applied events plus a snapshot.
// A snapshot at seq S makes journal entries <= S redundant, so Snapshot
// deletes them in the same transaction and the file stays bounded.
// One file holds the projection of every namespace, each in its own pair of
// buckets (Space). A Store is safe for use by one owner goroutine at a time.
type Store struct {
	db            *bolt.DB
	ns            string // the namespace whose projection this is
	journal, meta []byte // its bucket names
	// loaded, shared by a file's spaces, holds what a check at open
	// decoded, by namespace, until each space's first Load takes it.
	loaded *map[string]LoadResult
	// trace, shared by a file's spaces, is the usage trace kept in the
	// same file (OpenTrace); nil: none.
	trace *trace.Log
	sizes snapSizes // of this space's last snapshot
}

// OpenTrace keeps the usage trace (package trace) in the store's file,
// bounded by o: the spaces made afterwards (Space) journal the records
// their events make in the same transactions as the events.
func (st *Store) OpenTrace(o trace.Options) (*trace.Log, error) {
	l, err := trace.Open(st.db, o)
	if err != nil {
		return nil, err
	}
	st.trace = l
	return l, nil
}

// Trace returns the usage trace kept in the store's file; nil when none
// is (OpenTrace).
func (st *Store) Trace() *trace.Log {
	if st == nil {
		return nil
	}
	return st.trace
}

// DB returns the store's database, for reading the trace it holds
// (trace.Read); nothing else may write it.
func (st *Store) DB() *bolt.DB { return st.db }

// Space returns the store of namespace ns's projection, in the same file.
// CRI's namespace keeps the file's first buckets (journal, meta): they
// hold the projection agents wrote before they managed namespaces, which
// was CRI's by default. Buckets are created by the first write.
func (st *Store) Space(ns string) *Store {
	sp := &Store{db: st.db, ns: ns, journal: bucketJournal, meta: bucketMeta, loaded: st.loaded, trace: st.trace}
	if ns != events.CRINamespace {
		sp.journal, sp.meta = []byte(spacePrefixJournal+ns), []byte(spacePrefixMeta+ns)
	}
	return sp
}

const spacePrefixJournal, spacePrefixMeta = "journal/", "meta/"

// Spaces returns the namespaces with a persisted projection, sorted.
func (st *Store) Spaces() ([]string, error) {
	var out []string
	err := st.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			switch n := string(name); {
			case n == string(bucketMeta):
				if b.Get(keySnapshot) != nil || tx.Bucket(bucketJournal) != nil && tx.Bucket(bucketJournal).Stats().KeyN > 0 {
					out = append(out, events.CRINamespace)
				}
			case strings.HasPrefix(n, spacePrefixMeta):
				out = append(out, strings.TrimPrefix(n, spacePrefixMeta))
			}
			return nil
		})
	})
	slices.Sort(out)
	return out, err
}

// Drop deletes this namespace's projection from the file.
func (st *Store) Drop() error {
	return st.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{st.journal, st.meta} {
			if err := tx.DeleteBucket(b); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
		}
		return nil
	})
}

// buckets returns this space's buckets in a writable transaction,
// creating them on first use.
func (st *Store) buckets(tx *bolt.Tx) (journal, meta *bolt.Bucket, err error) {
	if journal, err = tx.CreateBucketIfNotExists(st.journal); err != nil {
		return nil, nil, err
	}
	meta, err = tx.CreateBucketIfNotExists(st.meta)
	return journal, meta, err
}

// OpenStore opens (or creates) the store file. It fails fast if another
// process holds it.
func OpenStore(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if le := locked(path, err); le != nil {
			return nil, le
		}
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketJournal, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	return &Store{db: db, ns: events.CRINamespace, journal: bucketJournal, meta: bucketMeta}, nil
}

// OpenStoreReadOnly opens an existing store for reading only, for tools
// that must never change or block the agent's file. It fails when the agent
// holds the file.
func OpenStoreReadOnly(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if err != nil {
		if le := locked(path, err); le != nil {
			return nil, le
		}
		return nil, fmt.Errorf("open state %s read-only: %w", path, err)
	}
	return &Store{db: db, ns: events.CRINamespace, journal: bucketJournal, meta: bucketMeta}, nil
}

// Close closes the file.
func (st *Store) Close() error { return st.db.Close() }

// LoadResult is what Load restored.
type LoadResult struct {
	State    *State
	Replayed int     // journal entries applied on top of the snapshot
	Skipped  []error // journal entries that could not be decoded
	// tracer, when the file keeps a usage trace, went through the replay
	// from the snapshot on: it holds the records of the replayed events
	// that the trace does not hold yet (those after the namespace's trace
	// seq), which a crash lost from memory.
	tracer *tracer
}

// Load returns the snapshot with the journal replayed on top. An entry that
// cannot be decoded is reported in Skipped and passed over: the reconcile
// that follows repairs what it described.
func (st *Store) Load() (LoadResult, error) {
	if st.loaded != nil {
		if res, ok := (*st.loaded)[st.ns]; ok {
			delete(*st.loaded, st.ns) // once: later loads read the file
			return res, nil
		}
	}
	res := LoadResult{State: New()}
	err := st.db.View(func(tx *bolt.Tx) error {
		meta, journal := tx.Bucket(st.meta), tx.Bucket(st.journal)
		if meta == nil || journal == nil {
			return nil // a file never written by an agent: nothing to restore
		}
		if b := meta.Get(keySnapshot); b != nil {
			s, err := decodeSnapshot(b)
			if err != nil {
				return fmt.Errorf("decode snapshot: %w", err)
			}
			s.fill()
			res.State = s
		}
		// The trace holds the records of the events up to traceSeq; those
		// of later ones were in memory only, and are made again here.
		var traceSeq uint64
		if trace.Kept(tx) {
			res.State.Namespace = st.ns
			res.tracer = newTracer(res.State)
			if v := meta.Get(keyTraceSeq); len(v) == 8 {
				traceSeq = binary.BigEndian.Uint64(v)
			}
		}
		c := journal.Cursor()
		for k, v := c.Seek(seqKey(res.State.Seq + 1)); k != nil; k, v = c.Next() {
			ev, err := events.Unmarshal(v)
			if err != nil {
				res.Skipped = append(res.Skipped, fmt.Errorf("journal entry %d: %w", binary.BigEndian.Uint64(k), err))
				res.State.Seq = binary.BigEndian.Uint64(k)
				continue
			}
			res.State.Apply(ev)
			if res.tracer != nil {
				res.tracer.observe(res.State, ev)
				if binary.BigEndian.Uint64(k) <= traceSeq {
					res.tracer.recs = res.tracer.recs[:0] // in the trace already
				}
			}
			// The key, not the count, is the position: a batch that failed
			// to journal (disk full) leaves a gap, and new entries must go
			// after the last key, never over it.
			res.State.Seq = binary.BigEndian.Uint64(k)
			res.Replayed++
		}
		// What was true before the restart must be confirmed by a reconcile
		// before anything is deleted.
		res.State.Synced = false
		return nil
	})
	return res, err
}

// Append journals events that were applied to reach seq last, in one
// transaction (one fsync for a batch). With recs (ignored without a
// trace), the trace records of every event up to last not in the trace
// yet, it adds them in the same transaction.
func (st *Store) Append(last uint64, evs []events.Event, recs ...trace.Record) error {
	if len(evs) == 0 && len(recs) == 0 {
		return nil
	}
	return st.db.Update(func(tx *bolt.Tx) error {
		if len(recs) > 0 {
			if err := st.putTrace(tx, last, recs); err != nil {
				return err
			}
		}
		b, _, err := st.buckets(tx)
		if err != nil {
			return err
		}
		first := last - uint64(len(evs)) + 1
		for i, ev := range evs {
			v, err := events.Marshal(ev)
			if err != nil {
				return err
			}
			if err := b.Put(seqKey(first+uint64(i)), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// putTrace adds recs, the trace records of the events up to seq, to the
// trace in tx, if the store keeps one, and notes seq as traced.
func (st *Store) putTrace(tx *bolt.Tx, seq uint64, recs []trace.Record) error {
	if st.trace == nil {
		return nil
	}
	if err := st.trace.PutTx(tx, recs); err != nil {
		return err
	}
	_, meta, err := st.buckets(tx)
	if err != nil {
		return err
	}
	return meta.Put(keyTraceSeq, seqKey(seq))
}

// PutTrace adds recs, the trace records of the events up to seq, to the
// trace (ignored without one), in a transaction of its own.
func (st *Store) PutTrace(seq uint64, recs []trace.Record) error {
	return st.db.Update(func(tx *bolt.Tx) error { return st.putTrace(tx, seq, recs) })
}

// Snapshot saves s and drops the journal entries it covers. With a trace,
// recs must be the trace records of every event up to s.Seq not in the
// trace yet: they are added in the same transaction.
func (st *Store) Snapshot(s *State, recs ...trace.Record) error {
	b := st.sizes.encode(s)
	return st.db.Update(func(tx *bolt.Tx) error {
		if err := st.putTrace(tx, s.Seq, recs); err != nil {
			return err
		}
		j, meta, err := st.buckets(tx)
		if err != nil {
			return err
		}
		if err := meta.Put(keySnapshot, b); err != nil {
			return err
		}
		// The snapshot usually covers the whole journal: drop the bucket at
		// once. Else delete the covered prefix in one forward walk (a cursor
		// stays valid across its own Delete; re-seeking the first key after
		// each one is quadratic in the journal's length).
		if k, _ := j.Cursor().Last(); k == nil || binary.BigEndian.Uint64(k) <= s.Seq {
			if err := tx.DeleteBucket(st.journal); err != nil {
				return err
			}
			_, err := tx.CreateBucket(st.journal)
			return err
		}
		c := j.Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= s.Seq; {
			if err := c.Delete(); err != nil {
				return err
			}
			k, _ = c.Seek(k)
		}
		return nil
	})
}

// JournalLen returns the number of journal entries not yet covered by a
// snapshot.
func (st *Store) JournalLen() (int, error) {
	var n int
	err := st.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(st.journal); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n, err
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

// fill replaces nil maps after decoding, so Apply never writes to a nil map.
func (s *State) fill() {
	if s.Images == nil {
		s.Images = map[string]*Image{}
	}
	// The name index is derived from the images, not persisted (older
	// snapshots carry it; it is rebuilt all the same).
	s.Names = map[string]string{}
	if s.Containers == nil {
		s.Containers = map[string]*Container{}
	}
	if s.Pods == nil {
		s.Pods = map[string]*Pod{}
	}

	for d, img := range s.Images {
		for i, n := range img.Names {
			s.Names[n.Name] = d
			img.Names[i].Labels = events.ImageLabels(n.Labels) // shared, as Apply keeps them
		}
	}
	for _, p := range s.Pods {
		if p.Sandboxes == nil {
			p.Sandboxes = map[string]struct{}{}
		}
	}
	s.reindex()
	// States written before RootKey existed: the key their Users held.
	// Then the use index, derived from the containers.
	s.users = newKeySets()
	for id, c := range s.Containers {
		s.keepUnit(c)
		if c.RootKey.IsZero() {
			c.RootKey = s.rootKey(c)
		}
		c.RootKey.v = c.digestOf(c.RootKey.v)
		for _, k := range c.UseKeys() {
			s.users.add(k, id) // a key a container holds twice is one use
		}
	}
}
