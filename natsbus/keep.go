package natsbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gcagent/gcagent/declared"
)

// The fleet keep list lives in one JetStream key-value bucket: one key per
// cluster (clusters.<cluster>) and one for every cluster (all). Operators'
// credentials write it (gcagent ctl keep); each agent watches the two keys
// it needs with an ephemeral ordered consumer (a KV watch), never a
// durable one, and persists what it saw. See docs/nats.md.
const (
	KeepBucket = "gcagent_keep"
	// KeepAllKey holds the patterns of every cluster.
	KeepAllKey = "all"
	// keepClusterPrefix starts the key of one cluster's patterns.
	keepClusterPrefix = "clusters."
	// keepMaxBytes bounds the bucket on a fleet's NATS: a list is a few
	// KiB at most.
	keepMaxBytes = 8 << 20
	keepMaxValue = 64 << 10
	// EmbeddedKeepMaxBytes bounds it on the agent's embedded server, whose
	// store it shares with the events stream (which leaves it this much).
	EmbeddedKeepMaxBytes = 256 << 10
)

// KeepClusterKey is the key of cluster's patterns in KeepBucket.
func KeepClusterKey(cluster string) string { return keepClusterPrefix + SafeToken(cluster) }

// KeepKeyCluster names the clusters a key's patterns apply to: the cluster,
// or "*" for KeepAllKey.
func KeepKeyCluster(key string) string {
	if key == KeepAllKey {
		return "*"
	}
	return strings.TrimPrefix(key, keepClusterPrefix)
}

// KeepList is the value of one key of KeepBucket.
type KeepList struct {
	Patterns  []string  `json:"patterns"`
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy,omitempty"`
	// Revision is the key's revision in the bucket (not stored in the value).
	Revision uint64 `json:"revision,omitempty"`
}

// KeepBucketConfig is the bucket's configuration with replicas (1 on a
// single server, 3 on a cluster) and maxBytes (0: 8 MiB).
func KeepBucketConfig(replicas int, maxBytes int64) jetstream.KeyValueConfig {
	if maxBytes <= 0 {
		maxBytes = keepMaxBytes
	}
	return jetstream.KeyValueConfig{Bucket: KeepBucket, Description: "gcagent fleet keep list: image patterns GC never deletes",
		History: 5, Replicas: max(replicas, 1), MaxBytes: maxBytes, MaxValueSize: keepMaxValue, Storage: jetstream.FileStorage}
}

// EnsureKeepBucket returns the bucket, creating it with replicas and
// maxBytes (0: 8 MiB) when it is missing (needs credentials allowed to
// create streams).
func EnsureKeepBucket(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, KeepBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, KeepBucketConfig(replicas, maxBytes))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, KeepBucket) // created meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("keep list bucket %s: %w", KeepBucket, err)
	}
	if err := liftKeepConsumers(ctx, js); err != nil {
		return nil, fmt.Errorf("keep list bucket %s: %w", KeepBucket, err)
	}
	return kv, nil
}

// KeepMaxConsumers is the consumer limit the keep bucket's stream gets:
// every agent watches its keys with one consumer each (three), and a
// server's default is 1,000 per stream (nats-server 2.10 and later, when
// neither the stream nor the account sets one): 333 agents.
const KeepMaxConsumers = 1 << 20

// errCodeCannotChangeMaxConsumers is the API error of a server that
// refuses to change a stream's consumer limit.
const errCodeCannotChangeMaxConsumers = 10052

// liftKeepConsumers sets the keep bucket's stream's consumer limit to
// KeepMaxConsumers when it is lower or unset: a bucket made by a version
// that did not, or by hand.
func liftKeepConsumers(ctx context.Context, js jetstream.JetStream) error {
	st, err := js.Stream(ctx, "KV_"+KeepBucket)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxConsumers >= KeepMaxConsumers {
		return nil
	}
	cfg.MaxConsumers = KeepMaxConsumers
	_, err = js.UpdateStream(ctx, cfg)
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == errCodeCannotChangeMaxConsumers {
		// A server before 2.10 (Debian's 2.9.10) cannot change it, and has
		// no default limit either: unset is unlimited there.
		return nil
	}
	if err != nil {
		return fmt.Errorf("lift its consumer limit to %d (a fleet's agents watch it with three consumers each): %w", KeepMaxConsumers, err)
	}
	return nil
}

// DecodeKeep reads a value of KeepBucket; an empty value (a delete) is an
// empty list. Anything else must be an object whose patterns key is a
// list of strings: a value written wrongly ({"images": [...]}, {}, null,
// "patterns": "x" or [1]) is an error, so that the agent keeps its last
// list (or, without one, the list stays unknown) rather than taking it
// for an empty one. Only patterns is needed: other fields, those a newer
// ctl or a hand-written `nats kv put` adds, and updatedAt or updatedBy in
// a form this version does not read, are ignored.
func DecodeKeep(b []byte) (KeepList, error) {
	var l KeepList
	if len(b) == 0 {
		return l, nil
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil || probe == nil {
		return l, fmt.Errorf("keep list value: want an object with patterns, got %.40q", b)
	}
	raw, ok := probe["patterns"]
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		return l, errors.New(`keep list value: no "patterns" key (an empty list is "patterns": [])`)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return l, fmt.Errorf(`keep list value: "patterns" is not a list: %.40q`, raw)
	}
	l.Patterns = make([]string, 0, len(items))
	for _, it := range items {
		var p string
		if string(bytes.TrimSpace(it)) == "null" || json.Unmarshal(it, &p) != nil {
			return KeepList{}, fmt.Errorf(`keep list value: "patterns" holds %.40q, not a string`, it)
		}
		l.Patterns = append(l.Patterns, p)
	}
	// Informational only: a form this version cannot read is left out.
	if json.Unmarshal(probe["updatedAt"], &l.UpdatedAt) != nil {
		l.UpdatedAt = time.Time{}
	}
	if json.Unmarshal(probe["updatedBy"], &l.UpdatedBy) != nil {
		l.UpdatedBy = ""
	}
	return l, nil
}

// EditKeep changes the patterns of key with edit (which gets the stored
// patterns and returns the new ones), by compare-and-set on the key's
// revision, retrying when another writer won. Fields of the stored value
// this version does not know (a newer writer's) are kept as they are. It
// returns the list stored.
func EditKeep(ctx context.Context, kv jetstream.KeyValue, key, by string, now func() time.Time, edit func([]string) ([]string, error)) (KeepList, error) {
	for attempt := 0; ; attempt++ {
		var cur KeepList
		var rev uint64
		extra := map[string]json.RawMessage{}
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		case err != nil:
			return cur, fmt.Errorf("read %s: %w", key, err)
		default:
			rev = e.Revision()
			if cur, err = DecodeKeep(e.Value()); err != nil {
				return cur, err
			}
			if len(e.Value()) > 0 {
				_ = json.Unmarshal(e.Value(), &extra) // DecodeKeep read it as an object
			}
		}
		patterns, err := edit(slices.Clone(cur.Patterns))
		if err != nil {
			return cur, err
		}
		next := KeepList{Patterns: patterns, UpdatedAt: now().UTC(), UpdatedBy: by}
		b, _ := json.Marshal(next)
		if len(extra) > 0 {
			var known map[string]json.RawMessage
			_ = json.Unmarshal(b, &known)
			delete(extra, "updatedBy") // omitted when empty: not the old one's
			maps.Copy(extra, known)
			b, _ = json.Marshal(extra)
		}
		if rev == 0 {
			rev, err = kv.Create(ctx, key, b)
		} else {
			rev, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			next.Revision = rev
			return next, nil
		}
		if attempt < 10 && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)) {
			continue // another writer won: read again
		}
		return cur, fmt.Errorf("write %s: %w", key, err)
	}
}

// ReadKeep returns every key's list in the bucket, by key; none when the
// bucket has no key.
func ReadKeep(ctx context.Context, kv jetstream.KeyValue) (map[string]KeepList, error) {
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[string]KeepList{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]KeepList{}
	for _, k := range keys {
		if strings.HasPrefix(k, declared.KeyPrefix) {
			continue // a cluster component's list: ReadCluster
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, err
		}
		l, err := DecodeKeep(e.Value())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		l.Revision = e.Revision()
		out[k] = l
	}
	return out, nil
}

// ReadCluster reads the cluster keep list gcagent-cluster writes for
// cluster (its head and the shards of the head's layout): nil when there
// is no head. A value that does not decode is an error.
func ReadCluster(ctx context.Context, kv jetstream.KeyValue, cluster string) (*declared.List, error) {
	cluster = SafeToken(cluster)
	e, err := kv.Get(ctx, declared.HeadKey(cluster))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h, err := declared.DecodeHead(e.Value())
	if err != nil {
		return nil, err
	}
	shards := map[string]declared.Shard{}
	for i := range h.Shards {
		key := declared.ShardKey(cluster, h.Shards, i)
		se, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, err
		}
		s, err := declared.DecodeShard(se.Value())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		shards[key] = s
	}
	l := declared.Assemble(cluster, &h, shards)
	return &l, nil
}

// ErrFilterIgnored says the server delivered a key a keep list watcher
// did not ask for: it ignores the consumer's filter subject.
var ErrFilterIgnored = errors.New("the NATS server ignores the watch's filter subject")

// Causes of a failed keep list watch, as logged and counted
// (KeepWatchCause).
const (
	KeepCauseServerTooOld   = "server-too-old"
	KeepCauseFilterIgnored  = "filter-ignored"
	KeepCauseNoJetStream    = "no-jetstream"
	KeepCausePermission     = "permission"
	KeepCauseTimeout        = "timeout"
	KeepCauseDisconnected   = "disconnected"
	KeepCauseWatchEnded     = "watch-ended"
	KeepCauseStalled        = "stalled"
	KeepCauseBucketNotFound = "no-bucket"
	KeepCauseOther          = "other"
)

// KeepWatchCauses are every cause KeepWatchCause returns.
var KeepWatchCauses = []string{KeepCauseServerTooOld, KeepCauseFilterIgnored, KeepCauseNoJetStream, KeepCausePermission,
	KeepCauseTimeout, KeepCauseDisconnected, KeepCauseWatchEnded, KeepCauseStalled, KeepCauseBucketNotFound, KeepCauseOther}

// KeepWatchCause sorts the error of a keep list watch (WatchKeep,
// EnsureKeepBucket) into one of KeepWatchCauses.
func KeepWatchCause(err error) string {
	var old *ServerTooOld
	msg := strings.ToLower(fmt.Sprint(err))
	switch {
	case errors.As(err, &old):
		return KeepCauseServerTooOld
	case errors.Is(err, ErrFilterIgnored):
		return KeepCauseFilterIgnored
	case errors.Is(err, ErrWatchStalled):
		return KeepCauseStalled
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return KeepCauseBucketNotFound
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return KeepCauseNoJetStream
	case errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization), strings.Contains(msg, "permissions violation"):
		return KeepCausePermission
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return KeepCauseTimeout
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrNoResponders):
		return KeepCauseDisconnected
	case strings.Contains(msg, "updates ended"):
		return KeepCauseWatchEnded
	}
	return KeepCauseOther
}
