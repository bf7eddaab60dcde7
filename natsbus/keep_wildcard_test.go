package natsbus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestKeepWatchWildcard: a key ending in ">" watches every key below it
// (the cluster component's declared.<cluster>.> keys) with one filter
// subject, on every supported server version: their current values come
// raw, before Synced; then each change and each delete; nothing of
// another cluster's keys or of the operator's keys.
func TestKeepWatchWildcard(t *testing.T) { keepServers(t, testKeepWatchWildcard) }

func testKeepWatchWildcard(t *testing.T, url string) {
	nc, err := Connect(ConnOptions{URL: url, Cluster: "prod", Node: "n1", InboxPrefix: InboxPrefix("prod", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := EnsureKeepBucket(ctx, js, 1, EmbeddedKeepMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, v string) {
		t.Helper()
		if _, err := kv.Put(ctx, key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	put("declared.prod.s16.3", `{"images":[{"ref":"a:1","n":1}]}`)
	put("declared.prod.head", `{"state":"complete","shards":16}`)
	put("declared.staging.head", `{"state":"syncing"}`)
	put(KeepAllKey, `{"patterns":["base/*"]}`)
	updates := make(chan KeepUpdate, 16)
	go func() {
		_ = WatchKeep(ctx, js, []string{"declared.prod.>"}, KeepWatchOptions{}, func(u KeepUpdate) {
			if !u.Alive {
				updates <- u
			}
		})
	}()
	next := func() KeepUpdate {
		t.Helper()
		select {
		case u := <-updates:
			return u
		case <-ctx.Done():
			t.Fatal("no update")
		}
		return KeepUpdate{}
	}
	got := map[string]string{}
	for range 2 {
		u := next()
		got[u.Key] = string(u.Value)
	}
	if len(got) != 2 || got["declared.prod.head"] != `{"state":"complete","shards":16}` || got["declared.prod.s16.3"] == "" {
		t.Fatalf("current values %v", got)
	}
	if u := next(); !u.Synced {
		t.Fatalf("want synced, got %+v", u)
	}
	put("declared.staging.s16.1", `{"images":[]}`)
	put("declared.prod.s16.3", `{"images":[]}`)
	if u := next(); u.Key != "declared.prod.s16.3" || string(u.Value) != `{"images":[]}` || u.Deleted {
		t.Fatalf("update %+v", u)
	}
	if err := kv.Delete(ctx, "declared.prod.head"); err != nil {
		t.Fatal(err)
	}
	if u := next(); u.Key != "declared.prod.head" || !u.Deleted {
		t.Fatalf("delete %+v", u)
	}
}
