// Package deletion is the delete transaction: every delete the agent makes
// is begun as a durable intent, then the call is made, then the intent is
// committed (its event is stored for NATS in the same write that drops it)
// or aborted. A call whose outcome is not known (a timeout, the daemon
// stopped mid-call, a follow-up lookup failing) is settled at once against
// the node's truth, exactly as a restart settles a leftover intent: object
// gone, the removal is committed; object there, the intent is aborted. While
// containerd cannot say, the intent stays pending and no other delete may
// begin (Begin fails with ErrUnsettled): invariant 6 of
// docs/architecture.md.
//
// Each delete holds its own *Tx, so an event can never be matched to
// another delete's intent, in another namespace or of another object.
package deletion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/schema"
)

// Intent is a delete the agent is about to make, recorded durably before
// it. It is keyed by Namespace, Kind, Subject (the object's id) and Seq.
type Intent struct {
	// Seq numbers the intent in its journal; part of the event key.
	Seq uint64 `json:"seq"`
	// At is when the intent was recorded (the delete came after).
	At time.Time `json:"at"`
	// Namespace is the containerd namespace of the object (empty for a
	// log, which lives on the filesystem).
	Namespace string `json:"namespace,omitempty"`
	// Kind, Action and Subject are the action's; Key is the final one
	// (the caller's key plus the journal's epoch and Seq).
	Kind    string `json:"kind"`
	Action  string `json:"action"`
	Subject string `json:"subject"`
	Key     string `json:"key"`
	// Data is the action's data as planned, published if the intent is
	// committed after a crash or an unknown outcome.
	Data json.RawMessage `json:"data,omitempty"`
	// Identity is the object's identity as containerd reported it right
	// before the delete; nil when none was recorded (a log, whose path is
	// its identity; an intent of a version before identities), and then
	// settling fails closed: an object found is not gone.
	Identity *Identity `json:"identity,omitempty"`
}

// Identity tells the object a delete is about from another one made
// since under the same key (a container id reused, an image name pulled
// again): settling compares it with what containerd reports then, never
// a wall-clock reading with another.
type Identity struct {
	// Created is a container's creation time as containerd stamped it.
	Created time.Time `json:"created,omitzero"`
	// Names are an image's names, each with its record's creation time,
	// as the re-check right before the delete read them.
	Names []Name `json:"names,omitempty"`
}

// Name is one image name and its record's creation time.
type Name struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// ContainerGone reports whether the container of an intent recorded
// with identity id is gone, now that the node found one of its id
// (found) created at created: only when it is another one (made again
// under its id). Without a recorded identity (an intent of a version
// before identities) a container found is not gone: fail closed.
func (id *Identity) ContainerGone(found bool, created time.Time) bool {
	if !found {
		return true
	}
	return id != nil && !id.Created.IsZero() && !created.Equal(id.Created)
}

// NameSurvives reports whether the image name name, found on the
// intent's digest with its record created at created, is one the delete
// was about: a name it recorded, with the same creation time. Without
// recorded names every name on the digest counts (fail closed).
func (id *Identity) NameSurvives(name string, created time.Time) bool {
	if id == nil || len(id.Names) == 0 {
		return true
	}
	for _, n := range id.Names {
		if n.Name == name && n.Created.Equal(created) {
			return true
		}
	}
	return false
}

// Journal durably records intents and turns them into events; the outbox
// (natsbus.Publisher) is one.
type Journal interface {
	// Intend records that the agent is about to do a to an object of
	// namespace ns, whose identity is id (nil: none), and returns the
	// intent, with a key unique to it.
	Intend(ns string, a schema.Action, id *Identity) (Intent, error)
	// Complete drops the intent and stores its event (data d, or the
	// recorded data when d is nil) in one write; completing an intent that
	// is no longer pending stores nothing and returns nil.
	Complete(in Intent, d any) error
	// Abandon drops the intent without an event.
	Abandon(in Intent) error
	// Pending returns the intents neither completed nor abandoned, oldest
	// first.
	Pending() ([]Intent, error)
	// Publish stores an event without an intent: the removal of a delete
	// whose intent could not be recorded.
	Publish(a schema.Action) error
}

// Checker asks the node whether the object of an intent is gone.
type Checker interface {
	// Gone reports whether the object in was about to delete no longer
	// exists as it did then: deleted, or deleted and made again (another
	// identity than in.Identity). Without a recorded identity an object
	// found is not gone. An error when the node cannot tell now.
	Gone(ctx context.Context, in Intent) (bool, error)
}

// ErrUnsettled says a delete's outcome is not known yet and the node
// cannot say what happened: nothing else may be deleted until it can.
var ErrUnsettled = errors.New("an earlier delete's outcome is not known yet")

// unsettled is a delete whose outcome is unknown: its intent, and, for a
// delete made without a durable intent, the action to publish if it
// happened.
type unsettled struct {
	in     Intent
	action *schema.Action
}

// Deps are what a Manager works through.
type Deps struct {
	Journal Journal
	Checker Checker
	// Lock, if set, must be held for a delete to begin (one agent per
	// containerd): Begin fails with its error otherwise; and again right
	// before the delete call, whose context ends with the hold (Tx.Call).
	Lock Lock
}

// Lock says whether this agent may delete now (containerd's agent lock,
// node.AgentLock).
type Lock interface {
	// Held returns nil while this agent holds the lock.
	Held() error
	// Hold checks it again and returns the context of one delete call,
	// ended when the hold ends, and done, to call once the call returned;
	// an error when it is not held now.
	Hold(ctx context.Context) (call context.Context, done context.CancelFunc, err error)
}

// Options tune a Manager.
type Options struct {
	// CheckTimeout bounds one Gone call. Default 10s.
	CheckTimeout time.Duration
	// AfterIntent and AfterDelete, when set, are called right after an
	// intent is recorded and right after a delete call returned without
	// error (before its event is stored). They exist for crash tests only.
	AfterIntent func(Intent)
	AfterDelete func(Intent)
	Log         zerolog.Logger
	// RetryGap is how long after a failed check the node is not asked
	// again: Begin fails fast meanwhile instead of stalling every caller
	// for CheckTimeout. Default 1s.
	RetryGap time.Duration
	// Clock gives the time and Run's retry timer. Default Go's.
	Clock clock.Timers
}

// Manager begins delete transactions and settles the ones whose outcome
// is unknown. It is safe for concurrent use.
type Manager struct {
	d    Deps
	o    Options
	now  func() time.Time
	wake chan struct{} // an unknown outcome to settle (Run)

	mu sync.Mutex
	// unsettled are deletes whose outcome is not known: left by a crash,
	// or a call that failed while the node could not say.
	unsettled []unsettled
	// inDoubt counts transactions asking the node right now whether their
	// failed call happened: no delete may begin meanwhile.
	inDoubt int
	// failedAt is when the node last could not settle one.
	failedAt time.Time
	// settling is held by the one caller asking the node about unsettled
	// deletes.
	settling sync.Mutex
	loaded   bool
	// unjournaled counts deletes made without a durable intent.
	unjournaled int
	// generation counts the unknown outcomes settled so far.
	generation uint64
}

// New returns a Manager; the leftovers of an earlier run are loaded from
// the journal on the first Begin or Settle.
func New(d Deps, o Options) (*Manager, error) {
	if d.Journal == nil || d.Checker == nil {
		return nil, errors.New("deletion: a journal and a checker are required")
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = 10 * time.Second
	}
	if o.RetryGap <= 0 {
		o.RetryGap = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.System(nil)
	}
	return &Manager{d: d, o: o, now: o.Clock.Now, wake: make(chan struct{}, 1)}, nil
}

// Begin records the intent of a, the delete of an object of namespace ns
// whose identity is id (as containerd reported it right before; nil for a
// log), and returns its transaction. While Deps.Lock is not held it fails
// with the lock's error and records nothing. It first settles every delete whose outcome
// is unknown; while one cannot be settled it fails with ErrUnsettled and
// records nothing. When the journal cannot be written (its disk is full,
// often the very disk GC must free) the delete goes on without a durable
// intent: its event is published on commit, and only a crash between the
// delete and that commit could lose it. That is logged and counted.
func (m *Manager) Begin(ctx context.Context, ns string, a schema.Action, id *Identity) (*Tx, error) {
	if m.d.Lock != nil {
		if err := m.d.Lock.Held(); err != nil {
			return nil, err
		}
	}
	if err := m.Settle(ctx); err != nil {
		return nil, err
	}
	in, err := m.d.Journal.Intend(ns, a, id)
	if err != nil {
		m.mu.Lock()
		m.unjournaled++
		n := m.unjournaled
		m.mu.Unlock()
		if n == 1 || n%100 == 0 {
			m.o.Log.Warn().Err(err).Str("kind", a.Kind).Str("subject", a.Subject).Int("deletes_without_intent", n).
				Msg("cannot record the delete intent; deleting without it")
		}
		return &Tx{m: m, in: Intent{At: m.now().UTC(), Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key,
			Identity: id}, action: &a}, nil
	}
	if m.o.AfterIntent != nil {
		m.o.AfterIntent(in)
	}
	return &Tx{m: m, in: in}, nil
}

// Settle resolves every delete whose outcome is unknown against the node:
// object gone, its event is stored under the intent's id (once, however
// often this runs); object there, the intent is dropped. It returns
// ErrUnsettled (wrapping the node's error) when one cannot be told yet,
// or while a failed delete is being checked, and leaves it for the next
// call; within RetryGap of a failed check it does not ask the node again.
func (m *Manager) Settle(ctx context.Context) error {
	m.mu.Lock()
	if !m.loaded {
		left, err := m.d.Journal.Pending()
		if err != nil {
			m.mu.Unlock()
			return fmt.Errorf("read delete intents: %w", err)
		}
		for _, in := range left {
			m.unsettled = append(m.unsettled, unsettled{in: in})
		}
		m.loaded = true
		if len(left) > 0 {
			m.o.Log.Info().Int("intents", len(left)).Msg("delete intents left by the last run: checking which deletes happened")
		}
	}
	switch {
	case m.inDoubt > 0:
		m.mu.Unlock()
		return fmt.Errorf("%w: a failed delete is being checked", ErrUnsettled)
	case len(m.unsettled) == 0:
		m.mu.Unlock()
		return nil
	case m.now().Sub(m.failedAt) < m.o.RetryGap:
		u := m.unsettled[0]
		m.mu.Unlock()
		return fmt.Errorf("%w: %s %s (containerd did not answer)", ErrUnsettled, u.in.Kind, u.in.Subject)
	}
	m.mu.Unlock()
	// One caller asks the node at a time, without m.mu: Unsettled,
	// Generation and Tx.Settle never wait for containerd; the others fail
	// fast rather than queue behind a hung call.
	if !m.settling.TryLock() {
		return fmt.Errorf("%w: an earlier delete is being checked", ErrUnsettled)
	}
	defer m.settling.Unlock()
	for {
		m.mu.Lock()
		if len(m.unsettled) == 0 {
			m.mu.Unlock()
			return nil
		}
		u := m.unsettled[0] // only the settling holder pops; Tx.Settle appends
		m.mu.Unlock()
		gone, err := m.gone(ctx, u.in)
		if err != nil {
			m.mu.Lock()
			m.failedAt = m.now()
			m.mu.Unlock()
			return fmt.Errorf("%w: %s %s: %w", ErrUnsettled, u.in.Kind, u.in.Subject, err)
		}
		// containerd has said what happened: the outcome is known even if
		// its record cannot be written now (a full state disk, often the
		// disk GC must free). The intent then stays in the journal and the
		// next start settles it again, once: Complete is idempotent.
		if err := m.resolve(u, gone); err != nil {
			m.o.Log.Error().Err(err).Str("namespace", u.in.Namespace).Str("kind", u.in.Kind).Str("subject", u.in.Subject).
				Msg("delete settled, but its record could not be written; the next start settles it again")
		}
		m.mu.Lock()
		m.unsettled = m.unsettled[1:]
		m.generation++
		m.mu.Unlock()
	}
}

// Generation counts the deletes whose unknown outcome has been settled
// (crash leftovers included). A caller that measured the disk before it
// changed must measure again before deleting on that measurement: the
// settled delete may have freed space it did not see.
func (m *Manager) Generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.generation
}

// Run settles, until ctx ends, every delete whose outcome is unknown as
// soon as the node can say: the leftovers of a crash at once, and each
// unknown outcome after it happens, also when no further delete begins,
// retrying with backoff (up to maxRetry) while containerd cannot answer.
// settled, if set, is called once, after the first Settle that succeeds:
// GC must not delete before (a new delete of the same object would make
// an old intent look done). Failures are logged once and then every
// tenth.
func (m *Manager) Run(ctx context.Context, settled func()) error {
	const firstRetry, maxRetry = 100 * time.Millisecond, 10 * time.Second
	retry := m.o.Clock.NewTimer(0) // at start: a crash's leftovers
	defer retry.Stop()
	wait, failures := firstRetry, 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C():
		case <-m.wake:
		}
		err := m.Settle(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			if settled != nil {
				settled()
				settled = nil
			}
			wait, failures = firstRetry, 0
			continue
		}
		failures++
		if failures == 1 || failures%10 == 0 {
			m.o.Log.Warn().Err(err).Int("failures", failures).Float64("retry_in_s", wait.Seconds()).
				Msg("cannot settle the deletes whose outcome is unknown yet")
		}
		retry.Reset(wait)
		wait = min(2*wait, maxRetry)
	}
}

// Unsettled returns how many deletes have an unknown outcome now.
func (m *Manager) Unsettled() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.unsettled)
}

func (m *Manager) gone(ctx context.Context, in Intent) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, m.o.CheckTimeout)
	defer cancel()
	return m.d.Checker.Gone(ctx, in)
}

// resolve commits (gone: the recorded data) or aborts u.
func (m *Manager) resolve(u unsettled, gone bool) error {
	in := u.in
	ev := m.o.Log.Info().Str("namespace", in.Namespace).Str("kind", in.Kind).Str("subject", in.Subject).Time("intended_at", in.At)
	switch {
	case gone && u.action != nil:
		if err := m.d.Journal.Publish(*u.action); err != nil {
			return fmt.Errorf("store the event of %s %s: %w", in.Kind, in.Subject, err)
		}
		ev.Msg("delete intent resolved: the object is gone, its event is published")
	case gone:
		if err := m.d.Journal.Complete(in, nil); err != nil {
			return fmt.Errorf("store the event of %s %s: %w", in.Kind, in.Subject, err)
		}
		ev.Msg("delete intent resolved: the object is gone, its event is published")
	case u.action != nil:
		ev.Msg("delete intent resolved: the object is still there, the intent is dropped")
	default:
		if err := m.d.Journal.Abandon(in); err != nil {
			return fmt.Errorf("drop the intent of %s %s: %w", in.Kind, in.Subject, err)
		}
		ev.Msg("delete intent resolved: the object is still there, the intent is dropped")
	}
	return nil
}

// Tx is one delete: begun by Manager.Begin, ended by exactly one of
// Commit, Abort or (after a failed call) Settle followed by Commit or
// Abort. It is used by one goroutine.
type Tx struct {
	m    *Manager
	in   Intent
	done bool
	// action is set when the intent could not be recorded: the commit
	// publishes it.
	action *schema.Action
	// refused is the lock's error when Call found it not held: no call
	// left. release ends the call's context.
	refused error
	release context.CancelFunc
}

// Call returns the context of t's delete call (every request of it):
// ctx, with the agent lock checked right now and ended when this agent's
// hold ends, so that a request sent after it (a slow settle or fsync
// before, a process frozen in between) is refused before it leaves. When
// the lock is not held now, the context is already ended with the lock's
// error as its cause, and Settle then reports NotHappened without asking
// the node. A delete that is not a request (a file) checks
// context.Cause(t.Call(ctx)) right before it. It ends with t; call it
// once. Without Deps.Lock it is ctx.
func (t *Tx) Call(ctx context.Context) context.Context {
	if t.m.d.Lock == nil {
		return ctx
	}
	call, done, err := t.m.d.Lock.Hold(ctx)
	if err != nil {
		t.refused = err
		t.m.o.Log.Warn().Err(err).Str("namespace", t.in.Namespace).Str("kind", t.in.Kind).Str("subject", t.in.Subject).
			Msg("delete not made: the agent lock is not held right before its call")
		refused, cancel := context.WithCancelCause(ctx)
		cancel(err)
		return refused
	}
	t.release = done
	return call
}

// end releases the call's context, once.
func (t *Tx) end() {
	if t.release != nil {
		t.release()
		t.release = nil
	}
}

// Intent returns the transaction's intent.
func (t *Tx) Intent() Intent { return t.in }

// Commit stores the removal's event with data d (nil: the data recorded
// with the intent) and ends t. The delete happened.
func (t *Tx) Commit(d any) error {
	if t.done {
		return errors.New("deletion: transaction already ended")
	}
	t.done = true
	t.end()
	if t.m.o.AfterDelete != nil {
		t.m.o.AfterDelete(t.in)
	}
	if t.action != nil {
		a := *t.action
		if d != nil {
			a.Data = d
		}
		return t.m.d.Journal.Publish(a)
	}
	return t.m.d.Journal.Complete(t.in, d)
}

// Abort drops the intent and ends t: the delete did not happen (the call
// said so, or the object is still there).
func (t *Tx) Abort() error {
	t.end()
	if t.done {
		return nil
	}
	t.done = true
	if t.action != nil {
		return nil
	}
	return t.m.d.Journal.Abandon(t.in)
}

// Outcome is what Settle learnt of a delete whose call failed.
type Outcome int

// The outcomes of a failed call.
const (
	// Happened: the object is gone; commit the removal.
	Happened Outcome = iota + 1
	// NotHappened: the object is still there; the intent is dropped.
	NotHappened
	// Unknown: the node cannot say now; the intent stays pending and no
	// delete may begin until it is settled.
	Unknown
)

// Settle asks the node, right after a delete call failed with an error
// that does not say the delete did not happen, whether the object is gone.
// No other delete begins while it asks. Happened: t stays open for the
// caller to measure and Commit. NotHappened: t is aborted. Unknown: t is
// left pending on the Manager, which settles it before any other delete;
// the error says why it is unknown. A call Call refused did not happen:
// NotHappened, with the lock's error.
func (t *Tx) Settle(ctx context.Context) (Outcome, error) {
	t.end()
	if t.refused != nil {
		return NotHappened, errors.Join(t.refused, t.Abort())
	}
	m := t.m
	m.mu.Lock()
	m.inDoubt++
	m.mu.Unlock()
	gone, err := m.gone(ctx, t.in)
	m.mu.Lock()
	m.inDoubt--
	if err != nil {
		t.done = true
		m.unsettled = append(m.unsettled, unsettled{in: t.in, action: t.action})
		m.failedAt = m.now()
		select {
		case m.wake <- struct{}{}: // Run settles it as soon as the node can say
		default:
		}
	}
	m.mu.Unlock()
	switch {
	case err != nil:
		m.o.Log.Warn().Err(err).Str("namespace", t.in.Namespace).Str("kind", t.in.Kind).Str("subject", t.in.Subject).
			Msg("delete outcome unknown: no other delete until containerd says what happened")
		return Unknown, err
	case gone:
		return Happened, nil
	}
	return NotHappened, t.Abort()
}
