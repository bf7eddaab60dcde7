package natsbus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestKeepBucketTakesAFleet: the keep bucket, as EnsureKeepBucket makes it
// (or finds it, made by an older ctl), takes more consumers than the
// server's default of 1,000 per stream (nats-server 2.10+; 333 agents
// with three watchers each), on every supported server version.
func TestKeepBucketTakesAFleet(t *testing.T) { keepServers(t, testKeepBucketTakesAFleet) }

func testKeepBucketTakesAFleet(t *testing.T, url string) {
	nc, err := Connect(ConnOptions{URL: url, Cluster: "prod", Node: "op"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A bucket as an older ctl made it: no consumer limit of its own.
	if _, err := js.CreateKeyValue(ctx, KeepBucketConfig(1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureKeepBucket(ctx, js, 1, 0); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_"+KeepBucket)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxConsumers; got < KeepMaxConsumers && got > 0 {
		t.Fatalf("max consumers %d, want at least %d or unlimited", got, KeepMaxConsumers)
	}
	for i := range 1010 {
		if _, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: fmt.Sprintf("$KV.%s.k%d", KeepBucket, i),
			AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute}); err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
	}
}
