package natsbus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultKeepHeartbeat is the idle heartbeat a keep list watcher asks of
// the server: a watcher that receives nothing for two of them is stalled.
const DefaultKeepHeartbeat = 5 * time.Second

// ErrWatchStalled says a keep list watcher received nothing (no value, no
// heartbeat) for two heartbeats, or missed a value, while its connection
// may be up: its consumer stopped delivering (removed with its bucket,
// which may have been made again meanwhile; dropped by the server). The
// watch must be made again from the current values, never resumed.
var ErrWatchStalled = errors.New("the keep list watch stopped delivering")

// KeepWatchOptions configures WatchKeep; zero fields take the defaults.
type KeepWatchOptions struct {
	// Heartbeat is the idle heartbeat each key's consumer asks of the
	// server. Default 5s (DefaultKeepHeartbeat).
	Heartbeat time.Duration
}

// KeepUpdate is one change a keep list watch delivers: the key's list
// (empty when the key was deleted), Synced once the current values of
// every watched key are delivered, or Alive. A key under a wildcard filter
// (the cluster component's declared.<cluster>.>, whose values are not
// lists of patterns) comes as Value, undecoded, and Deleted.
type KeepUpdate struct {
	Key     string
	List    KeepList
	Value   []byte
	Deleted bool
	Synced  bool
	// Alive, sent every heartbeat once synced, says that every watcher
	// received a value or the server's heartbeat within two heartbeats:
	// the list delivered is the server's now.
	Alive bool
	Err   error // a value that does not decode (the key's list is then unchanged)
}

// WatchKeep watches the keys of the bucket and calls fn with each update
// in order until ctx ends or the watch fails. A key may end in ">" (every
// key below it, each delivered as a raw Value). Each key has a watcher of
// its own: an ephemeral push consumer with one filter subject, delivering
// the key's last value and then each change, with idle heartbeats (a
// consumer with several filter subjects needs a 2.10 server, and 2.9
// refuses it, while one filter subject works on every version). A watcher
// that receives nothing for two heartbeats, or sees a value skipped, ends
// the watch with ErrWatchStalled (nats.ErrDisconnected while the
// connection is away): a new watch reads the current values again, where
// resuming from the last sequence seen would hide the first values of a
// bucket made again. It returns a *ServerTooOld before watching anything
// on a server older than MinServerVersion, jetstream.ErrBucketNotFound
// (wrapped) when the bucket does not exist, and ErrFilterIgnored when the
// server delivers a key it was not asked for.
func WatchKeep(ctx context.Context, js jetstream.JetStream, keys []string, o KeepWatchOptions, fn func(KeepUpdate)) error {
	nc := js.Conn()
	if err := CheckServerVersion(nc.ConnectedServerVersion(), "the fleet keep list watch"); err != nil {
		return err
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultKeepHeartbeat
	}
	if _, err := js.KeyValue(ctx, KeepBucket); err != nil {
		return fmt.Errorf("keep list bucket %s: %w", KeepBucket, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan keepMsg, 64)
	watchers := make([]*keepWatcher, 0, len(keys))
	pending := 0 // watchers that have not delivered their current value yet
	for i, key := range keys {
		w, err := startKeepWatcher(ctx, js, i, key, o.Heartbeat, msgs)
		if err != nil {
			return fmt.Errorf("watch keep list key %s: %w", key, err)
		}
		defer w.stop()
		watchers = append(watchers, w)
		if !w.synced {
			pending++
		}
	}
	if pending == 0 {
		fn(KeepUpdate{Synced: true})
	}
	tick := time.NewTicker(o.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			for _, w := range watchers {
				if since := time.Since(w.last); since > 2*o.Heartbeat {
					if !nc.IsConnected() {
						return fmt.Errorf("watch keep list key %s: connection lost: %w", w.key, nats.ErrDisconnected)
					}
					return fmt.Errorf("watch keep list key %s: %w: nothing received for %s (heartbeat %s)",
						w.key, ErrWatchStalled, since.Round(time.Millisecond), o.Heartbeat)
				}
			}
			if pending == 0 {
				fn(KeepUpdate{Alive: true})
			}
		case m := <-msgs:
			w := watchers[m.i]
			u, synced, err := w.handle(m.msg)
			if err != nil {
				return fmt.Errorf("watch keep list key %s: %w", w.key, err)
			}
			if u != nil {
				fn(*u)
			}
			if synced {
				if pending--; pending == 0 {
					fn(KeepUpdate{Synced: true})
				}
			}
		}
	}
}

// keepMsg is a message one watcher (i) received.
type keepMsg struct {
	i   int
	msg *nats.Msg
}

// keepWatcher is one key's consumer and what it delivered.
type keepWatcher struct {
	key, subject string
	nc           *nats.Conn
	api          string // the JetStream API prefix, with its trailing dot
	sub          *nats.Subscription
	name         string    // the consumer's, from its creation
	cseq         uint64    // the last consumer sequence delivered
	synced       bool      // the current value was delivered
	last         time.Time // when anything (value or heartbeat) last arrived
}

// startKeepWatcher subscribes to a new inbox, then makes the consumer
// that delivers key's last value and each change to it.
func startKeepWatcher(ctx context.Context, js jetstream.JetStream, i int, key string, heartbeat time.Duration, out chan<- keepMsg) (*keepWatcher, error) {
	nc := js.Conn()
	w := &keepWatcher{key: key, subject: "$KV." + KeepBucket + "." + key, nc: nc, api: apiPrefix(js), last: time.Now()}
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case out <- keepMsg{i: i, msg: m}:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return nil, err
	}
	w.sub = sub
	req, _ := json.Marshal(map[string]any{"stream_name": "KV_" + KeepBucket, "config": map[string]any{
		"deliver_subject": inbox, "deliver_policy": "last_per_subject", "ack_policy": "none",
		"filter_subject": w.subject, "replay_policy": "instant", "idle_heartbeat": heartbeat.Nanoseconds(),
		"mem_storage": true, "num_replicas": 1,
	}})
	rctx, cancel := context.WithTimeout(ctx, cmp.Or(js.Options().DefaultTimeout, 5*time.Second))
	defer cancel()
	resp, err := nc.RequestWithContext(rctx, w.api+"CONSUMER.CREATE.KV_"+KeepBucket, req)
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("create its consumer: %w", err)
	}
	var info struct {
		Name       string    `json:"name"`
		NumPending uint64    `json:"num_pending"`
		Error      *apiError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &info); err != nil || info.Error != nil || info.Name == "" {
		_ = sub.Unsubscribe()
		if info.Error != nil {
			return nil, fmt.Errorf("create its consumer: %w", info.Error.err())
		}
		return nil, fmt.Errorf("create its consumer: unexpected answer %.80q", resp.Data)
	}
	w.name, w.synced, w.last = info.Name, info.NumPending == 0, time.Now()
	return w, nil
}

// handle takes one message of w's consumer: a value (an update, and
// whether the current value is now delivered) or a heartbeat (none). A
// value skipped, a server status other than a heartbeat, or a key not
// asked for is an error.
func (w *keepWatcher) handle(m *nats.Msg) (*KeepUpdate, bool, error) {
	w.last = time.Now()
	if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
		if status != "100" {
			return nil, false, fmt.Errorf("%w: server status %s %s", ErrWatchStalled, status, m.Header.Get("Description"))
		}
		if m.Reply != "" {
			_ = m.Respond(nil) // flow control, though not asked for
		}
		if last := m.Header.Get("Nats-Last-Consumer"); last != "" {
			if n, err := strconv.ParseUint(last, 10, 64); err == nil && n != w.cseq {
				return nil, false, fmt.Errorf("%w: the server delivered %d values, the watch received %d", ErrWatchStalled, n, w.cseq)
			}
		}
		return nil, false, nil
	}
	meta, err := m.Metadata()
	if err != nil {
		return nil, false, fmt.Errorf("not a value of the bucket (%s): %w", m.Subject, err)
	}
	if meta.Sequence.Consumer != w.cseq+1 {
		return nil, false, fmt.Errorf("%w: value %d received after %d", ErrWatchStalled, meta.Sequence.Consumer, w.cseq)
	}
	w.cseq = meta.Sequence.Consumer
	key := strings.TrimPrefix(m.Subject, "$KV."+KeepBucket+".")
	if !w.covers(m.Subject) {
		// ADR-34: an old server may drop a consumer's filter silently;
		// then it delivers every key of the bucket.
		return nil, false, fmt.Errorf("%w: watching %s, got %s", ErrFilterIgnored, w.key, key)
	}
	u := &KeepUpdate{Key: key}
	gone := m.Header.Get("KV-Operation") != "" || m.Header.Get("Nats-Marker-Reason") != ""
	switch {
	case w.wildcard():
		u.Value, u.Deleted = m.Data, gone
	case gone:
		// DEL, PURGE, or a marker of a value gone by age: no list.
	default:
		u.List, u.Err = DecodeKeep(m.Data)
	}
	u.List.Revision = meta.Sequence.Stream
	synced := false
	if !w.synced && meta.NumPending == 0 {
		w.synced, synced = true, true
	}
	return u, synced, nil
}

// wildcard reports whether w watches every key below a prefix.
func (w *keepWatcher) wildcard() bool { return strings.HasSuffix(w.key, ">") }

// covers reports whether a value's subject is one w watches.
func (w *keepWatcher) covers(subject string) bool {
	if w.wildcard() {
		return strings.HasPrefix(subject, strings.TrimSuffix(w.subject, ">"))
	}
	return subject == w.subject
}

// stop unsubscribes and deletes the consumer (best effort: an ephemeral
// consumer without interest goes by itself).
func (w *keepWatcher) stop() {
	_ = w.sub.Unsubscribe()
	if w.name != "" && !w.nc.IsClosed() {
		subj := w.api + "CONSUMER.DELETE.KV_" + KeepBucket + "." + w.name
		go func() { _, _ = w.nc.Request(subj, nil, time.Second) }()
	}
}

// apiPrefix is js's JetStream API prefix ($JS.API., or a domain's), with
// its trailing dot.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	if o.Domain != "" {
		return "$JS." + o.Domain + ".API."
	}
	p := cmp.Or(o.APIPrefix, jetstream.DefaultAPIPrefix)
	if !strings.HasSuffix(p, ".") {
		p += "."
	}
	return p
}

// apiError is a JetStream API error answer.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

// err maps the answers WatchKeep's callers tell apart to jetstream's
// errors (KeepWatchCause sorts them).
func (e *apiError) err() error {
	err := fmt.Errorf("nats: API error: code=%d err_code=%d description=%s", e.Code, e.ErrCode, e.Description)
	switch e.ErrCode {
	case 10059: // stream not found
		return fmt.Errorf("%w (%v)", jetstream.ErrBucketNotFound, err)
	case 10039, 10076: // JetStream not enabled (for the account)
		return fmt.Errorf("%w (%v)", jetstream.ErrJetStreamNotEnabled, err)
	}
	return err
}
