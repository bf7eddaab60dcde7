package natsbus

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestKeepWatch: a watch of a cluster's key and the all key sees their
// current values, then each change, and nothing of another cluster's key.
func TestKeepWatch(t *testing.T) {
	s := runServer(t, -1, t.TempDir(), true)
	nc, err := Connect(ConnOptions{URL: s.ClientURL(), Cluster: "prod", Node: "n1", InboxPrefix: InboxPrefix("prod", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := WatchKeep(ctx, js, []string{KeepAllKey}, func(KeepUpdate) {}); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("watch without a bucket: %v", err)
	}
	kv, err := EnsureKeepBucket(ctx, js, 1, EmbeddedKeepMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	add := func(key, p string) {
		t.Helper()
		if _, err := EditKeep(ctx, kv, key, "test", time.Now, func(l []string) ([]string, error) { return append(l, p), nil }); err != nil {
			t.Fatal(err)
		}
	}
	add(KeepAllKey, "base/*")
	updates := make(chan KeepUpdate, 16)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	keys := []string{KeepAllKey, KeepClusterKey("prod")}
	go func() {
		done <- WatchKeep(wctx, js, keys, func(u KeepUpdate) { updates <- u })
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
	if u := next(); u.Key != KeepAllKey || !slices.Equal(u.List.Patterns, []string{"base/*"}) {
		t.Fatalf("first update %+v", u)
	}
	if u := next(); !u.Synced {
		t.Fatalf("want synced, got %+v", u)
	}
	add(KeepClusterKey("staging"), "other/*")
	add(KeepClusterKey("prod"), "app:*")
	if u := next(); u.Key != KeepClusterKey("prod") || !slices.Equal(u.List.Patterns, []string{"app:*"}) {
		t.Fatalf("update %+v", u)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{KeepAllKey, KeepClusterKey("prod")}) {
		t.Fatalf("the watch changed the caller's keys: %v", keys)
	}
	lists, err := ReadKeep(ctx, kv)
	if err != nil || len(lists) != 3 {
		t.Fatalf("read %v %v", lists, err)
	}
}
