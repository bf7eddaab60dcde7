package declared

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
)

// The cluster key of the fleet keep list: keys of the keep list's bucket
// (natsbus.KeepBucket) under declared.<cluster>. One head says the list's
// state, its layout and when the component last said it is alive; shards
// hold the images, each image in the shard its hash names, so that a
// change rewrites one small value and reaches every agent as such. Agents
// read them with one watch of declared.<cluster>.> (one filter subject:
// every NATS server version takes it). The component writes shards before
// the head that names their layout, so an agent that reads a head has read
// its shards (a stream delivers in order).

// State is the published list's state.
type State string

// The states of the list.
const (
	// Syncing: not every informer has synced since the component (or its
	// leader) started; the shards are the last leader's, if any.
	Syncing State = "syncing"
	// Complete: every kind that counts was read; the shards are the list.
	Complete State = "complete"
	// Incomplete: a kind could not be read (RBAC denies it, the API server
	// is down): the shards hold the last complete list plus what was read
	// since, and nothing is released meanwhile.
	Incomplete State = "incomplete"
)

// Head is the value of the head key.
type Head struct {
	State State `json:"state"`
	// Reason says, for a list not complete, why (which kind, what error).
	Reason string `json:"reason,omitempty"`
	// Shards is the layout: how many shard keys hold the list (0: none
	// yet).
	Shards    int `json:"shards"`
	Images    int `json:"images"`
	Workloads int `json:"workloads"`
	// Kinds are the kinds that count; Namespaces which namespaces ("*":
	// all), ExcludeNamespaces those left out.
	Kinds             []string `json:"kinds,omitempty"`
	Namespaces        []string `json:"namespaces,omitempty"`
	ExcludeNamespaces []string `json:"excludeNamespaces,omitempty"`
	// ReleaseAfterS is the grace, in seconds, an image keeps after its
	// last workload stops naming it.
	ReleaseAfterS float64 `json:"releaseAfterS"`
	// Heartbeat is when the component wrote this head, by its clock;
	// HeartbeatEveryS how often it does. A head not rewritten for a few
	// periods means the component stopped: agents call the list stale.
	Heartbeat       time.Time `json:"heartbeat"`
	HeartbeatEveryS float64   `json:"heartbeatEveryS"`
	// Since is when the list entered its state.
	Since time.Time `json:"since"`
	// By names the instance that wrote it (the leader's pod).
	By string `json:"by,omitempty"`
}

// ShardImage is one image of a shard.
type ShardImage struct {
	// Ref is the keep pattern: the normalized reference (Normalize).
	Ref string `json:"ref"`
	// By are up to MaxSources of the workloads that name it (Workload's
	// String); N is how many do.
	By []string `json:"by,omitempty"`
	N  int      `json:"n"`
	// Undeclared is when its last workload stopped naming it (set while it
	// waits out the grace; absent while declared).
	Undeclared *time.Time `json:"undeclared,omitempty"`
}

// Shard is the value of one shard key.
type Shard struct {
	Images []ShardImage `json:"images"`
}

// MaxSources bounds how many workloads a shard names per image.
const MaxSources = 3

// MinShards is the fewest shards a list is laid out in; MaxShards the most.
const (
	MinShards = 16
	MaxShards = 4096
)

// MaxShardBytes is the size Layout keeps every shard under: far below a
// bucket's value limit, and small enough that one change costs a fleet
// little.
const MaxShardBytes = 32 << 10

// KeyPrefix starts every key of a cluster list.
const KeyPrefix = "declared."

// HeadKey is the head's key of cluster (a NATS-safe token).
func HeadKey(cluster string) string { return KeyPrefix + cluster + ".head" }

// ShardKey is the key of shard i of a layout of n shards.
func ShardKey(cluster string, n, i int) string {
	return KeyPrefix + cluster + ".s" + strconv.Itoa(n) + "." + strconv.Itoa(i)
}

// WatchKeys is the key filter that watches every key of cluster's list.
func WatchKeys(cluster string) string { return KeyPrefix + cluster + ".>" }

// ParseKey says what a key of cluster's list is: the head, or shard i of a
// layout of n; ok is false for anything else.
func ParseKey(cluster, key string) (head bool, n, i int, ok bool) {
	rest, found := strings.CutPrefix(key, KeyPrefix+cluster+".")
	if !found {
		return false, 0, 0, false
	}
	if rest == "head" {
		return true, 0, 0, true
	}
	layout, idx, found := strings.Cut(strings.TrimPrefix(rest, "s"), ".")
	if !found || !strings.HasPrefix(rest, "s") {
		return false, 0, 0, false
	}
	n, err1 := strconv.Atoi(layout)
	i, err2 := strconv.Atoi(idx)
	if err1 != nil || err2 != nil || n < 1 || n > MaxShards || i < 0 || i >= n {
		return false, 0, 0, false
	}
	return false, n, i, true
}

// ShardOf is the shard of a layout of n that holds ref.
func ShardOf(ref string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(ref))
	return int(h.Sum32() % uint32(n))
}

// Normalize returns the keep pattern that covers exactly the image a
// workload's reference names, as the runtime pulls it: the reference in
// full (docker.io/library/nginx:latest for nginx, the default tag added),
// and for one with a digest the digest alone (nginx:1.25@sha256:... pulls
// docker.io/library/nginx@sha256:...). A reference the runtime could not
// pull is an error. The result has no glob character: as a keep pattern
// it matches that name only.
func Normalize(ref string) (string, error) {
	n, err := reference.ParseDockerRef(strings.TrimSpace(ref))
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	return n.String(), nil
}

// Layout lays entries out in the fewest shards (a power of two from
// MinShards to MaxShards) whose encodings are each at most maxBytes
// (MaxShardBytes when 0), and returns the shards.
func Layout(entries []Entry, maxBytes int) []Shard {
	if maxBytes <= 0 {
		maxBytes = MaxShardBytes
	}
	for n := MinShards; ; n *= 2 {
		shards := make([]Shard, n)
		size := make([]int, n)
		fits := true
		for _, e := range entries {
			i := ShardOf(e.Image, n)
			si := shardImage(e)
			shards[i].Images = append(shards[i].Images, si)
			b, _ := json.Marshal(si)
			size[i] += len(b) + 1
			if size[i] > maxBytes {
				fits = false
			}
		}
		if fits || n >= MaxShards {
			for i := range shards {
				if shards[i].Images == nil {
					shards[i].Images = []ShardImage{}
				}
			}
			return shards
		}
	}
}

func shardImage(e Entry) ShardImage {
	si := ShardImage{Ref: e.Image, N: len(e.By)}
	for _, w := range e.By[:min(len(e.By), MaxSources)] {
		si.By = append(si.By, w.String())
	}
	if !e.Undeclared.IsZero() {
		t := e.Undeclared.UTC()
		si.Undeclared = &t
	}
	return si
}

// DecodeHead reads a head value. Unknown fields are ignored (a newer
// component may add some); a state this version does not know is an
// error, as is a layout out of range.
func DecodeHead(b []byte) (Head, error) {
	var h Head
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("cluster keep list head: %w", err)
	}
	switch h.State {
	case Syncing, Complete, Incomplete:
	default:
		return h, fmt.Errorf("cluster keep list head: unknown state %q", h.State)
	}
	if h.Shards < 0 || h.Shards > MaxShards {
		return h, fmt.Errorf("cluster keep list head: %d shards", h.Shards)
	}
	return h, nil
}

// DecodeShard reads a shard value. Unknown fields are ignored; an image
// without a reference is an error (the shard is not taken at all).
func DecodeShard(b []byte) (Shard, error) {
	var s Shard
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("cluster keep list shard: %w", err)
	}
	if s.Images == nil {
		return s, fmt.Errorf("cluster keep list shard: no images key")
	}
	for _, im := range s.Images {
		if im.Ref == "" {
			return s, fmt.Errorf("cluster keep list shard: an image without ref")
		}
	}
	return s, nil
}

// List is what a reader makes of the keys of one cluster list it holds.
type List struct {
	// Head is nil when no head was read.
	Head *Head
	// Images are the images of the head's layout, sorted by Ref.
	Images []ShardImage
	// Missing counts the shards of the head's layout not held (not read
	// yet, or not decodable): the list is not whole.
	Missing int
}

// Whole reports whether the head is complete and every shard of its
// layout is held.
func (l List) Whole() bool { return l.Head != nil && l.Head.State == Complete && l.Missing == 0 }

// Assemble builds the list from a head (nil: none) and the shards held,
// by key (ParseKey): only the head's layout counts.
func Assemble(cluster string, head *Head, shards map[string]Shard) List {
	l := List{Head: head}
	if head == nil {
		return l
	}
	for i := range head.Shards {
		s, ok := shards[ShardKey(cluster, head.Shards, i)]
		if !ok {
			l.Missing++
			continue
		}
		l.Images = append(l.Images, s.Images...)
	}
	slices.SortFunc(l.Images, func(a, b ShardImage) int { return strings.Compare(a.Ref, b.Ref) })
	return l
}

// Patterns returns the keep patterns of l's images.
func (l List) Patterns() []string {
	out := make([]string, 0, len(l.Images))
	for _, im := range l.Images {
		out = append(out, im.Ref)
	}
	return out
}

// Sources says who declares ref ("Deployment/shop/web, CronJob/batch/x
// and 3 more"), "" when l does not hold it.
func (l List) Sources(ref string) string {
	i, found := slices.BinarySearchFunc(l.Images, ref, func(a ShardImage, r string) int { return strings.Compare(a.Ref, r) })
	if !found {
		return ""
	}
	return describe(l.Images[i])
}

func describe(im ShardImage) string {
	if im.N == 0 && im.Undeclared != nil {
		return "no workload since " + im.Undeclared.UTC().Format(time.RFC3339) + " (released after the grace)"
	}
	s := strings.Join(im.By, ", ")
	if more := im.N - len(im.By); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
