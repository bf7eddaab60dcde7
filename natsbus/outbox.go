package natsbus

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OutboxFile is the outbox's file name under the state dir.
const OutboxFile = "outbox.db"

var entriesBucket = []byte("entries")

// entry is one event waiting for its ack. It is stored under its sequence
// number (big endian, so iteration is in enqueue order) as 8 bytes of
// enqueue time (unix nanoseconds) followed by the JSON of the entry.
type entry struct {
	seq     uint64
	at      time.Time
	ID      string          `json:"id"`
	Subject string          `json:"subject"`
	Node    string          `json:"node"`
	Kind    string          `json:"kind"`
	Event   json.RawMessage `json:"event"`
}

// limits bound the outbox; when over a bound the oldest entries are dropped.
type limits struct {
	maxEntries int
	maxBytes   int64
	maxAge     time.Duration
}

// drop reports entries removed unsent: to stay within the limits, or
// because they could not be decoded.
type drop struct {
	n      int
	oldest string // id (or "seq N" when it cannot be read) of the oldest entry dropped
	err    error  // why the oldest corrupt entry could not be decoded; nil for a bound
}

// outbox is a durable FIFO of events in a bbolt file. Every write is one
// fsync'd transaction. It is safe for concurrent use.
type outbox struct {
	db  *bolt.DB
	lim limits

	mu    sync.Mutex // held across write transactions; guards count and bytes
	count int
	bytes int64
}

// openOutbox opens (creating it if needed) the outbox file at path; it fails
// after a second when another process holds the file.
func openOutbox(path string, lim limits) (*outbox, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("natsbus: outbox dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("natsbus: open outbox %s: %w", path, err)
	}
	o := &outbox{db: db, lim: lim}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(entriesBucket)
		if err != nil {
			return err
		}
		return b.ForEach(func(_, v []byte) error {
			o.count++
			o.bytes += int64(len(v))
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("natsbus: open outbox %s: %w", path, err)
	}
	return o, nil
}

func encodeEntry(e entry) ([]byte, error) {
	js, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	v := make([]byte, 8, 8+len(js))
	binary.BigEndian.PutUint64(v, uint64(e.at.UnixNano()))
	return append(v, js...), nil
}

func decodeEntry(k, v []byte) (entry, error) {
	var e entry
	if len(k) != 8 || len(v) < 8 {
		return e, errors.New("natsbus: corrupt outbox entry")
	}
	if err := json.Unmarshal(v[8:], &e); err != nil {
		return e, fmt.Errorf("natsbus: corrupt outbox entry %d: %w", binary.BigEndian.Uint64(k), err)
	}
	if e.ID == "" || e.Subject == "" || len(e.Event) == 0 {
		return e, fmt.Errorf("natsbus: corrupt outbox entry %d: no id, subject or event", binary.BigEndian.Uint64(k))
	}
	e.seq = binary.BigEndian.Uint64(k)
	e.at = entryTime(v)
	return e, nil
}

func entryTime(v []byte) time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(v[:8]))) }

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

// append stores e (with e.at set by the caller) after dropping what is too old
// or what must go to make room; it fails when e alone exceeds the byte bound.
func (o *outbox) append(e entry) (drop, error) { return o.appendWith(e, nil) }

// appendWith is append with also run in the same transaction (nil: nothing),
// so that what also writes and the entry are stored together or not at all.
func (o *outbox) appendWith(e entry, also func(tx *bolt.Tx) error) (drop, error) {
	v, err := encodeEntry(e)
	if err != nil {
		return drop{}, fmt.Errorf("natsbus: encode event %s: %w", e.ID, err)
	}
	if o.lim.maxBytes > 0 && int64(len(v)) > o.lim.maxBytes {
		return drop{}, fmt.Errorf("natsbus: event %s is %d bytes, more than the outbox bound of %d", e.ID, len(v), o.lim.maxBytes)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var d drop
	var count, bytes = o.count, o.bytes
	err = o.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		d, count, bytes = o.dropLocked(b, e.at, func(count int, bytes int64) bool {
			return (o.lim.maxEntries > 0 && count+1 > o.lim.maxEntries) ||
				(o.lim.maxBytes > 0 && bytes+int64(len(v)) > o.lim.maxBytes)
		})
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		count++
		bytes += int64(len(v))
		if also != nil {
			if err := also(tx); err != nil {
				return err
			}
		}
		return b.Put(seqKey(seq), v)
	})
	if err != nil {
		return drop{}, fmt.Errorf("natsbus: store event %s: %w", e.ID, err)
	}
	o.count, o.bytes = count, bytes
	return d, nil
}

// expire drops the entries older than the age bound at now.
func (o *outbox) expire(now time.Time) (drop, error) {
	if o.lim.maxAge <= 0 {
		return drop{}, nil
	}
	stale := false
	err := o.db.View(func(tx *bolt.Tx) error { // a cheap look first: most rounds drop nothing
		_, v := tx.Bucket(entriesBucket).Cursor().First()
		stale = len(v) >= 8 && now.Sub(entryTime(v)) > o.lim.maxAge
		return nil
	})
	if err != nil || !stale {
		return drop{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var d drop
	var count, bytes = o.count, o.bytes
	err = o.db.Update(func(tx *bolt.Tx) error {
		d, count, bytes = o.dropLocked(tx.Bucket(entriesBucket), now, func(int, int64) bool { return false })
		return nil
	})
	if err != nil {
		return drop{}, fmt.Errorf("natsbus: expire outbox: %w", err)
	}
	o.count, o.bytes = count, bytes
	return d, nil
}

// dropLocked deletes the oldest entries while they are older than the age
// bound at now or while over(count, bytes) says the outbox is too full, and
// returns what it dropped and the new count and bytes. o.mu must be held.
func (o *outbox) dropLocked(b *bolt.Bucket, now time.Time, over func(int, int64) bool) (drop, int, int64) {
	var d drop
	count, bytes := o.count, o.bytes
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.First() {
		expired := o.lim.maxAge > 0 && len(v) >= 8 && now.Sub(entryTime(v)) > o.lim.maxAge
		if !expired && !over(count, bytes) {
			break
		}
		if d.n == 0 {
			if e, err := decodeEntry(k, v); err == nil {
				d.oldest = e.ID
			} else {
				d.oldest = keyName(k)
			}
		}
		if err := c.Delete(); err != nil {
			break
		}
		d.n++
		count--
		bytes -= int64(len(v))
	}
	return d, count, bytes
}

// peek returns up to max of the oldest entries, oldest first, without
// removing them. Entries that cannot be decoded would block delivery
// forever: peek deletes them and reports them as dropped.
func (o *outbox) peek(max int) ([]entry, drop, error) {
	var out []entry
	var corrupt [][]byte
	var d drop
	err := o.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(entriesBucket).Cursor()
		for k, v := c.First(); k != nil && len(out) < max; k, v = c.Next() {
			e, err := decodeEntry(k, v)
			if err != nil {
				if d.err == nil {
					d.oldest, d.err = keyName(k), err
				}
				corrupt = append(corrupt, slices.Clone(k))
				continue
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil || len(corrupt) == 0 {
		return out, drop{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var count, bytes = o.count, o.bytes
	err = o.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		for _, k := range corrupt {
			v := b.Get(k)
			if v == nil { // dropped meanwhile for a bound
				continue
			}
			count--
			bytes -= int64(len(v))
			d.n++
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, drop{}, fmt.Errorf("natsbus: drop corrupt outbox entries: %w", err)
	}
	o.count, o.bytes = count, bytes
	return out, d, nil
}

// keyName names an entry by its key for a log line: "seq N".
func keyName(k []byte) string {
	if len(k) != 8 {
		return fmt.Sprintf("key %x", k)
	}
	return fmt.Sprintf("seq %d", binary.BigEndian.Uint64(k))
}

// remove deletes the entries with these sequence numbers; missing ones are ignored.
func (o *outbox) remove(seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var count, bytes = o.count, o.bytes
	err := o.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(entriesBucket)
		for _, seq := range seqs {
			k := seqKey(seq)
			v := b.Get(k)
			if v == nil {
				continue
			}
			count--
			bytes -= int64(len(v))
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("natsbus: remove acked events: %w", err)
	}
	o.count, o.bytes = count, bytes
	return nil
}

// depth returns how many entries the outbox holds and their stored size in bytes.
func (o *outbox) depth() (int, int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count, o.bytes
}

func (o *outbox) close() error { return o.db.Close() }
