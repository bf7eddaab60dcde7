package natsbus

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"

	"github.com/gcagent/gcagent/deletion"
)

var (
	intentsBucket = []byte("intents")
	metaBucket    = []byte("meta")
	epochKey      = []byte("epoch")
)

// Intent is a delete the agent is about to make, recorded durably before
// it (deletion.Intent). After the delete the caller completes it (its event
// goes into the outbox in the same transaction that drops the intent) or
// abandons it (the delete did not happen). An intent left by a crash is
// found by Pending at the next start.
type Intent = deletion.Intent

// intentAction returns the intent's action with data d (nil: the recorded data).
func intentAction(in Intent, d any) Action {
	a := Action{Kind: in.Kind, Action: in.Action, Subject: in.Subject, Key: in.Key, Data: d}
	if d == nil && len(in.Data) > 0 {
		a.Data = in.Data
	}
	return a
}

var _ deletion.Journal = (*Publisher)(nil)

// Intend records that the agent is about to do a (a delete of an object of
// containerd namespace ns, whose identity id, if any, is recorded with it)
// and returns the intent. The event key becomes a.Key + "/" + the outbox's epoch + "." + a
// sequence number persisted with the intent: unique per action even when
// the caller's key repeats (an image re-pulled and deleted again, a
// container id reused), and the same for the event of this action however
// often it is retried. It fails when the action is invalid or the outbox
// cannot be written; the caller may then delete without an intent.
func (p *Publisher) Intend(ns string, a Action, id *deletion.Identity) (Intent, error) {
	select {
	case <-p.closing:
		return Intent{}, ErrClosed
	default:
	}
	if a.Kind == "" || a.Action == "" || a.Key == "" {
		return Intent{}, errors.New("natsbus: an intent needs a kind, an action and a key")
	}
	in := Intent{At: p.opts.Now().UTC(), Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Identity: id}
	if a.Data != nil {
		d, err := json.Marshal(a.Data)
		if err != nil {
			return Intent{}, fmt.Errorf("natsbus: marshal intent data: %w", err)
		}
		in.Data = d
	}
	err := p.ob.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		epoch := meta.Get(epochKey)
		if epoch == nil {
			var b [6]byte
			_, _ = rand.Read(b[:])
			epoch = []byte(hex.EncodeToString(b[:]))
			if err := meta.Put(epochKey, epoch); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucketIfNotExists(intentsBucket)
		if err != nil {
			return err
		}
		if in.Seq, err = b.NextSequence(); err != nil {
			return err
		}
		in.Key = a.Key + "/" + string(epoch) + "." + strconv.FormatUint(in.Seq, 10)
		v, err := json.Marshal(in)
		if err != nil {
			return err
		}
		return b.Put(seqKey(in.Seq), v)
	})
	if err != nil {
		return Intent{}, fmt.Errorf("natsbus: record intent for %s.%s %s: %w", a.Kind, a.Action, a.Subject, err)
	}
	p.m.intents.WithLabelValues("recorded").Inc()
	return in, nil
}

// Complete turns the intent into its event: in one transaction the intent
// is dropped and the event (the intent's key, data d, or the recorded data
// when d is nil) is stored in the outbox. Completing an intent that is no
// longer pending stores nothing and returns nil, so a retry never makes a
// second event.
func (p *Publisher) Complete(in Intent, d any) error {
	select {
	case <-p.closing:
		return ErrClosed
	default:
	}
	a := intentAction(in, d)
	now := p.opts.Now()
	ev, payload, err := p.encode(a, now)
	if err != nil {
		return err
	}
	errNotPending := errors.New("not pending")
	dr, err := p.ob.appendWith(entry{
		at: now, ID: ev.ID, Kind: a.Kind, Node: p.opts.Node, Event: payload,
		Subject: Subject(p.opts.Cluster, p.opts.Node, a.Kind, a.Action),
	}, func(tx *bolt.Tx) error {
		b := tx.Bucket(intentsBucket)
		if b == nil || b.Get(seqKey(in.Seq)) == nil {
			return errNotPending
		}
		return b.Delete(seqKey(in.Seq))
	})
	if errors.Is(err, errNotPending) {
		return nil
	}
	if err != nil {
		return err
	}
	p.m.intents.WithLabelValues("completed").Inc()
	p.reportDrop(dr)
	n, _ := p.ob.depth()
	p.m.depth.Set(float64(n))
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// Abandon drops the intent without an event: the delete did not happen.
func (p *Publisher) Abandon(in Intent) error {
	err := p.ob.db.Update(func(tx *bolt.Tx) error {
		if b := tx.Bucket(intentsBucket); b != nil {
			return b.Delete(seqKey(in.Seq))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("natsbus: drop intent %d: %w", in.Seq, err)
	}
	p.m.intents.WithLabelValues("abandoned").Inc()
	return nil
}

// Pending returns the intents recorded and neither completed nor abandoned,
// oldest first: after a crash, the deletes that may or may not have
// happened. An intent that cannot be decoded is dropped and counted.
func (p *Publisher) Pending() ([]Intent, error) {
	var out []Intent
	var bad [][]byte
	err := p.ob.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(intentsBucket)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var in Intent
			if err := json.Unmarshal(v, &in); err != nil || in.Key == "" || in.Kind == "" || len(k) != 8 {
				bad = append(bad, append([]byte(nil), k...))
				return nil
			}
			out = append(out, in)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("natsbus: read intents: %w", err)
	}
	if len(bad) > 0 {
		_ = p.ob.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(intentsBucket)
			for _, k := range bad {
				_ = b.Delete(k)
			}
			return nil
		})
		p.m.intents.WithLabelValues("corrupt").Add(float64(len(bad)))
		p.log.Error().Int("intents", len(bad)).Msg("intents that cannot be decoded: dropped them")
	}
	return out, nil
}
