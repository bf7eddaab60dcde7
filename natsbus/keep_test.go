package natsbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// keepServers runs fn against each server version the keep list must work
// on: the Go module's (go.mod's version) and Debian's nats-server 2.9.10,
// the oldest supported (MinServerVersion).
func keepServers(t *testing.T, fn func(t *testing.T, url string)) {
	t.Run("go-module", func(t *testing.T) { fn(t, runServer(t, -1, t.TempDir(), true).ClientURL()) })
	t.Run("debian", func(t *testing.T) {
		s := testenv.StartDebianNATS(t, testenv.DebianNATSOptions{})
		t.Logf("nats-server %s", s.Version)
		fn(t, s.URL)
	})
}

// TestKeepWatch: a watch of a cluster's key and the all key sees their
// current values, then each change, and nothing of another cluster's key,
// on every supported server version (Debian's 2.9.10 refuses a consumer
// with several filter subjects).
func TestKeepWatch(t *testing.T) { keepServers(t, testKeepWatch) }

func testKeepWatch(t *testing.T, url string) {
	nc, err := Connect(ConnOptions{URL: url, Cluster: "prod", Node: "n1", InboxPrefix: InboxPrefix("prod", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := WatchKeep(ctx, js, []string{KeepAllKey}, KeepWatchOptions{}, func(KeepUpdate) {}); !errors.Is(err, jetstream.ErrBucketNotFound) {
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
		done <- WatchKeep(wctx, js, keys, KeepWatchOptions{}, func(u KeepUpdate) {
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

// TestCheckServerVersion: servers older than MinServerVersion are refused
// with the version needed; newer ones, and a version not known (not
// connected), are not.
func TestCheckServerVersion(t *testing.T) {
	for v, old := range map[string]bool{
		"2.9.10": false, "v2.9.10": false, "2.9.11": false, "2.10.0": false, "2.10.0-beta.3": false, "3.0.0": false, "2.12.3": false,
		"2.9.9": true, "2.9.0": true, "2.8.4": true, "2.2.6": true, "1.4.1": true,
		"": false, "unknown": false,
	} {
		err := CheckServerVersion(v, "the fleet keep list watch")
		var too *ServerTooOld
		if errors.As(err, &too) != old {
			t.Errorf("%q: %v, want too old %v", v, err, old)
		}
		if old && (too.Need != MinServerVersion || KeepWatchCause(fmt.Errorf("wrapped: %w", err)) != KeepCauseServerTooOld) {
			t.Errorf("%q: %+v (cause %s)", v, too, KeepWatchCause(err))
		}
	}
	want := "NATS server 2.8.4 is too old for the fleet keep list watch: it needs " + MinServerVersion + " or later"
	if err := CheckServerVersion("2.8.4", "the fleet keep list watch"); err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
}

// TestKeepWatchCause sorts the errors a watch meets.
func TestKeepWatchCause(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("keep list bucket: %w", jetstream.ErrBucketNotFound), KeepCauseBucketNotFound},
		{fmt.Errorf("x: %w", ErrFilterIgnored), KeepCauseFilterIgnored},
		{jetstream.ErrJetStreamNotEnabled, KeepCauseNoJetStream},
		{errors.New(`nats: permissions violation for subscription to "$JS.API.>"`), KeepCausePermission},
		{context.DeadlineExceeded, KeepCauseTimeout},
		{fmt.Errorf("watch: %w", nats.ErrConnectionClosed), KeepCauseDisconnected},
		{errors.New("watch keep list key all: updates ended"), KeepCauseWatchEnded},
		{fmt.Errorf("watch keep list key all: %w: nothing received for 10s", ErrWatchStalled), KeepCauseStalled},
		{errors.New("nats: API error: code=500 err_code=10012 description=insufficient resources"), KeepCauseOther},
	} {
		if got := KeepWatchCause(c.err); got != c.want || !slices.Contains(KeepWatchCauses, got) {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
}

// TestKeepWatchBucketMadeAgain: the bucket is removed and made again with
// another value within a heartbeat. The watch must not go on from the
// sequence it had reached (the new bucket's first values lie below it and
// would stay hidden for good): it ends as stalled within a few heartbeats,
// and a new watch reads the new value. Until then it said Alive only while
// heartbeats came. On d7dd547 the watch (an ordered consumer resuming
// after the last sequence it saw) neither ended nor delivered the value.
func TestKeepWatchBucketMadeAgain(t *testing.T) { keepServers(t, testKeepWatchBucketMadeAgain) }

func testKeepWatchBucketMadeAgain(t *testing.T, url string) {
	nc, err := Connect(ConnOptions{URL: url, Cluster: "prod", Node: "n1", InboxPrefix: InboxPrefix("prod", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put := func(patterns ...string) {
		t.Helper()
		kv, err := EnsureKeepBucket(ctx, js, 1, EmbeddedKeepMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := EditKeep(ctx, kv, KeepAllKey, "test", time.Now, func([]string) ([]string, error) { return patterns, nil }); err != nil {
			t.Fatal(err)
		}
	}
	put("old/a")
	put("old/b") // the watch reaches sequence 2
	const hb = 300 * time.Millisecond
	watch := func(want []string) error {
		t.Helper()
		got := make(chan []string, 16)
		alive := make(chan struct{}, 16)
		done := make(chan error, 1)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			done <- WatchKeep(wctx, js, []string{KeepAllKey}, KeepWatchOptions{Heartbeat: hb}, func(u KeepUpdate) {
				switch {
				case u.Alive:
					alive <- struct{}{}
				case !u.Synced:
					got <- u.List.Patterns
				}
			})
		}()
		select {
		case p := <-got:
			if !slices.Equal(p, want) {
				t.Fatalf("watch read %v, want %v", p, want)
			}
		case err := <-done:
			t.Fatalf("watch ended before its first value: %v", err)
		case <-ctx.Done():
			t.Fatal("no value")
		}
		select {
		case <-alive:
		case err := <-done:
			t.Fatalf("watch ended before a heartbeat: %v", err)
		case <-time.After(10 * hb):
			t.Fatal("no Alive update within 10 heartbeats")
		}
		if want[0] != "old/b" {
			return nil
		}
		// Removed and made again with one value (sequence 1), at once.
		if err := js.DeleteKeyValue(ctx, KeepBucket); err != nil {
			t.Fatal(err)
		}
		put("new/c")
		for {
			select {
			case p := <-got:
				t.Fatalf("the old watch delivered %v", p)
			case <-alive:
			case err := <-done:
				return err
			case <-time.After(20 * hb):
				t.Fatal("the watch of the removed bucket neither ended nor delivered within 20 heartbeats")
			}
		}
	}
	if err := watch([]string{"old/b"}); !errors.Is(err, ErrWatchStalled) || KeepWatchCause(err) != KeepCauseStalled {
		t.Fatalf("the old watch ended with %v, want stalled", err)
	}
	_ = watch([]string{"new/c"})
}
